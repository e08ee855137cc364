//! The desktop workbench (eframe/egui): configure an experiment, train it, watch it learn.
//!
//! Only this module imports egui, eframe, egui_plot and rfd. Training runs on the worker
//! threads of [`crate::train::spawn`], analyses and file reads on short-lived threads; each frame
//! the UI drains their channels ([`RunStore::drain`]) and repaints when one of them wakes it.
//! The editor's preset, the run list and the open tab survive a restart (eframe persistence).

mod editor;
mod export;
mod job;
mod runs;
mod shell;
mod views;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use eframe::egui;
use serde::{Deserialize, Serialize};

pub use editor::Editor;
pub use export::Exporter;
pub use runs::{RunStore, RunView};
pub use shell::run_native;
pub use views::Tab;

use crate::Preset;

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

/// A file chosen in a native dialog (on a background thread), and what it is for.
enum Picked {
    OpenPreset(PathBuf),
    SavePreset(PathBuf),
    OpenRun(PathBuf),
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
    attention: views::attention::AttentionView,
    pub encodings: views::encodings::EncodingsView,
    pub iou: views::iou::IouView,
    pub spectra: views::spectra::SpectraView,
    pub sweep: views::sweep::SweepView,
    pub extrapolation: views::extrapolation::ExtrapolationView,
    shipped: Vec<PathBuf>,
    dialog: Option<Receiver<Option<Picked>>>,
    /// A preset waiting for "discard unsaved changes?" to be answered.
    confirm_replace: Option<(Preset, Option<PathBuf>)>,
}

/// The TOML files shipped in `dir` (`presets/`, `sweeps/`), if the app runs from a checkout.
fn shipped_files(dir: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

impl AttnlabApp {
    /// A window restored from `persisted` (the defaults on first start).
    pub fn new(persisted: Persisted) -> Self {
        let preset = persisted
            .preset_toml
            .as_deref()
            .and_then(|text| Preset::parse(text, &[], Path::new("(last session)")).ok())
            .unwrap_or_else(default_preset);
        let mut app = Self {
            editor: Editor::new(preset, persisted.preset_path),
            runs: RunStore::default(),
            tab: persisted.tab,
            exporter: Exporter::default(),
            runs_root: persisted.runs_root.unwrap_or_else(|| PathBuf::from("runs")),
            recent: persisted.recent,
            status: String::new(),
            attention: Default::default(),
            encodings: Default::default(),
            iou: Default::default(),
            spectra: Default::default(),
            sweep: Default::default(),
            extrapolation: Default::default(),
            shipped: shipped_files("presets"),
            dialog: None,
            confirm_replace: None,
        };
        for dir in persisted.run_dirs {
            if dir.join("preset.toml").is_file() {
                app.runs.open(dir, || {});
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
    pub fn start(&mut self, ctx: &egui::Context) {
        self.editor.refresh();
        if let Some(problem) = self.editor.problem() {
            self.status = problem.to_string();
            return;
        }
        let ctx = ctx.clone();
        self.runs.start(
            self.editor.preset.clone(),
            self.runs_root.clone(),
            move || ctx.request_repaint(),
        );
        self.status = format!("started {}", self.editor.preset.name);
    }

    /// For the screenshot demo: gets `tab` ready to be captured (the analysis views need the
    /// run stopped and their analysis computed); true once it is.
    fn prepare_demo_tab(&mut self, tab: Tab, ctx: &egui::Context) -> bool {
        let computed = match tab {
            Tab::Sweep => {
                if !self.sweep.is_loaded() {
                    self.sweep.load(Path::new("sweeps/mqar_fig1_small.toml"));
                }
                true
            }
            Tab::Iou => !self.iou.tables.is_empty(),
            Tab::Spectra => !self.spectra.spectra.is_empty(),
            _ => return true,
        };
        if computed {
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
        match tab {
            Tab::Iou if !self.iou.is_busy() => {
                self.iou.protocol.examples = 1000;
                self.iou.start(ctx, list);
            }
            Tab::Spectra if !self.spectra.is_busy() => {
                self.spectra.protocol.examples = 200;
                self.spectra.start(ctx, list);
            }
            _ => {}
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

    /// Opens a native file dialog on a background thread.
    fn ask(&mut self, ctx: &egui::Context, pick: impl FnOnce() -> Option<Picked> + Send + 'static) {
        if self.dialog.is_some() {
            self.status = "a file dialog is already open".into();
            return;
        }
        let (sender, receiver) = std::sync::mpsc::channel();
        let ctx = ctx.clone();
        std::thread::spawn(move || {
            let _ = sender.send(pick());
            ctx.request_repaint();
        });
        self.dialog = Some(receiver);
    }

    fn ask_open_preset(&mut self, ctx: &egui::Context) {
        self.ask(ctx, || {
            rfd::FileDialog::new()
                .add_filter("attnlab preset", &["toml"])
                .set_directory("presets")
                .pick_file()
                .map(Picked::OpenPreset)
        });
    }

    fn ask_save_preset(&mut self, ctx: &egui::Context) {
        let name = format!("{}.toml", self.editor.preset.slug());
        self.ask(ctx, move || {
            rfd::FileDialog::new()
                .add_filter("attnlab preset", &["toml"])
                .set_file_name(name)
                .save_file()
                .map(Picked::SavePreset)
        });
    }

    fn ask_open_run(&mut self, ctx: &egui::Context) {
        let root = self.runs_root.clone();
        self.ask(ctx, move || {
            rfd::FileDialog::new()
                .set_directory(root)
                .pick_folder()
                .map(Picked::OpenRun)
        });
    }

    /// Everything that happens between frames: worker events, dialog answers, exports.
    pub fn logic(&mut self, ctx: &egui::Context) {
        let repaint = {
            let ctx = ctx.clone();
            move || ctx.request_repaint()
        };
        self.editor.refresh();
        self.runs.drain(repaint.clone());
        self.sweep.drain(ctx);
        if let Some(receiver) = &self.dialog
            && let Ok(picked) = receiver.try_recv()
        {
            self.dialog = None;
            match picked {
                Some(Picked::OpenPreset(path)) => self.open_preset(&path),
                Some(Picked::SavePreset(path)) => self.save_preset(&path),
                Some(Picked::OpenRun(path)) => self.runs.open(path, repaint),
                None => {}
            }
        }
        if let Some(message) = self.exporter.finished().pop() {
            self.status = message;
        }
        self.shortcuts(ctx);
    }

    fn shortcuts(&mut self, ctx: &egui::Context) {
        use egui::{Key, KeyboardShortcut, Modifiers};
        let pressed = |key| {
            ctx.input_mut(|i| i.consume_shortcut(&KeyboardShortcut::new(Modifiers::COMMAND, key)))
        };
        if pressed(Key::O) {
            self.ask_open_preset(ctx);
        }
        if pressed(Key::S) {
            match self.editor.path.clone() {
                Some(path) => self.save_preset(&path),
                None => self.ask_save_preset(ctx),
            }
        }
        if pressed(Key::Enter) {
            self.start(ctx);
        }
        if pressed(Key::Period) {
            self.stop();
        }
    }

    /// The whole window (the same function runs under eframe and under egui_kittest).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.logic(&ui.ctx().clone());
        egui::Panel::top("menu").show(ui, |ui| self.top_bar(ui));
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label(&self.status);
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
                for tab in Tab::ALL {
                    ui.selectable_value(&mut self.tab, tab, tab.label());
                }
            });
            ui.separator();
            let run = self.runs.selected();
            match self.tab {
                Tab::Training => views::training::ui(ui, run, &self.exporter),
                Tab::Attention => self.attention.ui(ui, run, &self.exporter),
                Tab::Iou => self.iou.ui(ui, &self.runs, &self.exporter),
                Tab::Spectra => self.spectra.ui(ui, &self.runs, &self.exporter),
                Tab::Encodings => {
                    let model = &self.editor.preset.model;
                    let shape = (
                        model.n_heads,
                        self.editor.preset.attention.qk_dim(model.head_dim()),
                    );
                    self.encodings
                        .ui(ui, &self.editor.preset.encoding, shape, run, &self.exporter);
                }
                Tab::Sweep => self.sweep.ui(ui, &self.exporter),
                Tab::Extrapolation => self.extrapolation.ui(
                    ui,
                    &mut self.runs,
                    &self.runs_root,
                    &self.shipped,
                    &self.exporter,
                ),
            }
        });
        self.confirm_ui(ui.ctx());
    }

    fn top_bar(&mut self, ui: &mut egui::Ui) {
        let ctx = ui.ctx().clone();
        ui.horizontal(|ui| {
            ui.menu_button("Preset", |ui| {
                if ui.button("New").clicked() {
                    self.replace_preset(default_preset(), None);
                }
                if ui.button("Open... (Ctrl+O)").clicked() {
                    self.ask_open_preset(&ctx);
                }
                if ui.button("Save (Ctrl+S)").clicked() {
                    match self.editor.path.clone() {
                        Some(path) => self.save_preset(&path),
                        None => self.ask_save_preset(&ctx),
                    }
                }
                if ui.button("Save as...").clicked() {
                    self.ask_save_preset(&ctx);
                }
                ui.separator();
                ui.label("Shipped");
                for path in self.shipped.clone() {
                    let name = path
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    if ui.button(name).clicked() {
                        self.open_preset(&path);
                    }
                }
                if !self.recent.is_empty() {
                    ui.separator();
                    ui.label("Recent");
                    for path in self.recent.clone() {
                        if ui.button(path.display().to_string()).clicked() {
                            self.open_preset(&path);
                        }
                    }
                }
            });
            if ui.button("Open run...").clicked() {
                self.ask_open_run(&ctx);
            }
            ui.separator();
            let problem = self.editor.problem().map(str::to_string);
            let start = ui
                .add_enabled(problem.is_none(), egui::Button::new("Start"))
                .on_hover_text("train the preset (Ctrl+Enter)")
                .on_disabled_hover_text(problem.unwrap_or_default());
            if start.clicked() {
                self.start(&ctx);
            }
            let running = self.runs.selected().is_some_and(RunView::is_running);
            if ui
                .add_enabled(running, egui::Button::new("Stop"))
                .on_hover_text("Ctrl+.")
                .clicked()
            {
                self.stop();
            }
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
        for (i, run) in self.runs.runs.iter().enumerate() {
            ui.horizontal(|ui| {
                let remove = ui
                    .add_enabled(!run.is_running(), egui::Button::new("x").small())
                    .on_hover_text("remove from the list (the run folder stays)");
                if remove.clicked() {
                    removed = Some(i);
                }
                let text = format!("{} ({})", run.name, run.status);
                let response = ui.selectable_label(self.runs.selected == Some(i), text);
                let hover = match (&run.error, &run.dir) {
                    (Some(error), _) => error.clone(),
                    (None, Some(dir)) => dir.display().to_string(),
                    (None, None) => "starting".into(),
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

/// Steps, ETA and throughput of a run.
fn progress_ui(ui: &mut egui::Ui, run: &RunView) {
    let progress = run.progress();
    let mut text = format!("{} {:.0}%", run.status, 100.0 * progress);
    if let Some(last) = run.steps.last() {
        if run.is_running() && progress > 0.0 {
            let eta = last.elapsed_secs * (1.0 / f64::from(progress) - 1.0);
            text.push_str(&format!(", eta {eta:.0} s"));
        }
        text.push_str(&format!(", {:.0} tokens/s", last.tokens_per_s));
    }
    ui.add(
        egui::ProgressBar::new(progress)
            .desired_width(280.0)
            .text(text),
    );
}

/// The preset a new window starts with: the shipped softmax MQAR experiment.
pub(crate) fn default_preset() -> Preset {
    Preset::parse(
        include_str!("../../presets/mqar_softmax.toml"),
        &[],
        Path::new("presets/mqar_softmax.toml"),
    )
    .unwrap_or_default()
}
