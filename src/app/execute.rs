//! The shell's command handling: what each [`Command`] does to the window's state (start and
//! stop runs, open and save presets, native dialogs, the welcome page's experiments).

use std::path::{Path, PathBuf};

use super::prompt::{self, PathPrompt, PathRequest};
use super::{AttnlabApp, Awaiting, Command, DEFAULT_PRESET, Editor, Tab, default_preset, tab_of};
use crate::Preset;
use crate::experiments::{EXPERIMENTS, Experiment, shipped};

impl AttnlabApp {
    /// Starts the editor's preset, unless it is invalid.
    pub fn start(&mut self) {
        self.editor.refresh();
        if let Some(problem) = self.editor.problem() {
            self.status.set(problem.to_string());
            return;
        }
        self.runs
            .start(self.editor.preset.clone(), self.runs_root.clone());
        self.status
            .set(format!("started {}", self.editor.preset.name));
    }

    /// Starts an experiment of the welcome page: its first preset into the editor (asking
    /// about unsaved changes), every preset training, its view shown, and its analysis
    /// awaited when it needs finished runs.
    pub(super) fn run_experiment(&mut self, experiment: &Experiment) {
        let presets = match experiment.presets() {
            Ok(presets) => presets,
            Err(e) => {
                self.status.set(e.to_string());
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
        self.status.set(match keep_edits {
            true => format!(
                "started {} (the editor keeps your unsaved preset)",
                experiment.title
            ),
            false => format!("started {}", experiment.title),
        });
    }

    /// Names run `id` `name` in its preset and summary (its folder keeps its name).
    pub fn rename_run(&mut self, id: u64, name: &str) {
        let Some(run) = self.runs.runs.iter_mut().find(|r| r.id == id) else {
            return;
        };
        let renamed = match (&run.dir, run.rename_refusal()) {
            (_, Some(why)) => Err(why),
            (None, None) => Err("it has no run folder yet".to_string()),
            (Some(dir), None) => crate::train::RunDir::open(dir)
                .and_then(|dir| dir.rename(name))
                .map_err(|e| e.to_string()),
        };
        match renamed {
            Ok(()) => {
                self.status.set(format!("renamed {} to {name}", run.name));
                run.name = name.to_string();
                run.preset.name = name.to_string();
            }
            Err(why) => self
                .status
                .set(format!("cannot rename {}: {why}", run.name)),
        }
    }

    /// Stops the selected run after its current step.
    pub fn stop(&mut self) {
        if let Some(run) = self.runs.selected() {
            run.stop();
            self.status.set(match run.trained_by() {
                Some(owner) => format!("{} is trained by {owner}: stop it there", run.name),
                None => format!("stopping {}", run.name),
            });
        }
    }

    /// Loads a preset file into the editor (asking first if there are unsaved changes).
    pub fn open_preset(&mut self, path: &Path) {
        match Preset::load(path, &[]) {
            Ok(preset) => self.replace_preset(preset, Some(path.to_path_buf())),
            Err(e) => self.status.set(e.to_string()),
        }
    }

    pub(super) fn replace_preset(&mut self, preset: Preset, path: Option<PathBuf>) {
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

    pub(super) fn remember(&mut self, path: PathBuf) {
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
                self.status.set(format!("saved {}", path.display()));
            }
            Err(e) => self.status.set(e.to_string()),
        }
    }

    /// Asks for a path: a native file dialog `pick` as a job, or where none opens the app's own
    /// window titled `title`, starting at `default` ([`super::prompt`]); `answer` turns the
    /// path into the command to run (nothing when the dialog is cancelled).
    pub(super) fn ask(
        &mut self,
        (title, default): (&str, PathBuf),
        pick: impl FnOnce() -> Option<PathBuf> + Send + 'static,
        answer: fn(PathBuf) -> Command,
    ) {
        if self.dialog.is_some() || self.prompt.is_some() {
            self.status.set("a file dialog is already open");
            return;
        }
        let request = |why: &str| PathRequest {
            title: title.to_string(),
            default,
            why: why.to_string(),
            answer,
        };
        if let Some(why) = prompt::dialogs_missing() {
            self.prompt = Some(PathPrompt::new(request(why)));
            return;
        }
        let request = request("");
        let commands = self.commands.clone();
        self.dialog = Some(
            self.jobs
                .run("file dialog", move || match prompt::pick_with(pick) {
                    Ok(Some(path)) => commands.push(answer(path)),
                    Ok(None) => {}
                    Err(why) => commands.push(Command::AskPath(PathRequest {
                        why: why.to_string(),
                        ..request
                    })),
                }),
        );
    }

    pub(super) fn ask_open_preset(&mut self) {
        self.ask(
            ("Open preset", PathBuf::from("presets")),
            || {
                rfd::FileDialog::new()
                    .add_filter("attnlab preset", &["toml"])
                    .set_directory("presets")
                    .pick_file()
            },
            Command::OpenPreset,
        );
    }

    pub(super) fn ask_save_preset(&mut self) {
        let name = format!("{}.toml", self.editor.preset.slug());
        self.ask(
            ("Save preset as", PathBuf::from(&name)),
            move || {
                rfd::FileDialog::new()
                    .add_filter("attnlab preset", &["toml"])
                    .set_file_name(name)
                    .save_file()
            },
            Command::SavePreset,
        );
    }

    pub(super) fn ask_open_run(&mut self) {
        let root = self.runs_root.clone();
        self.ask(
            ("Open run folder", root.clone()),
            move || rfd::FileDialog::new().set_directory(root).pick_folder(),
            Command::OpenRun,
        );
    }

    /// Does what `command` asks.
    pub fn execute(&mut self, command: Command) {
        match command {
            Command::Start => self.start(),
            Command::Stop => self.stop(),
            Command::RenameRun(id, name) => self.rename_run(id, &name),
            Command::NewPreset => self.replace_preset(default_preset(), None),
            Command::AskOpenPreset => self.ask_open_preset(),
            Command::OpenPreset(path) => self.open_preset(&path),
            Command::OpenShipped(name) => match shipped(name).and_then(|s| s.preset(&[])) {
                Ok(preset) => self.replace_preset(preset, None),
                Err(e) => self.status.set(e.to_string()),
            },
            Command::RunExperiment(i) => match EXPERIMENTS.get(i) {
                Some(experiment) => self.run_experiment(experiment),
                None => self.status.set(format!("no experiment {i}")),
            },
            Command::Save => match self.editor.path.clone() {
                Some(path) => self.save_preset(&path),
                None => self.ask_save_preset(),
            },
            Command::AskSavePreset => self.ask_save_preset(),
            Command::SavePreset(path) => self.save_preset(&path),
            Command::AskOpenRun => self.ask_open_run(),
            Command::OpenRun(dir) => self.runs.open(dir),
            Command::AskOpenModel => self.ask(
                ("Open Hugging Face model folder", PathBuf::new()),
                || rfd::FileDialog::new().pick_folder(),
                Command::OpenModel,
            ),
            Command::OpenModel(dir) => {
                self.tab = Tab::Pretrained;
                // The Extrapolation view scores the same model on a text file.
                self.views.extrapolation.model_folder = dir.display().to_string();
                self.views.pretrained.open(&self.jobs, dir);
            }
            Command::Show(tab) => self.tab = tab,
            Command::ToggleShortcuts => self.show_shortcuts = !self.show_shortcuts,
            Command::CopyCliCommand => match self.cli_command() {
                Ok(line) => {
                    self.status.set(format!("copied: {line}"));
                    self.clipboard = Some(line);
                }
                Err(e) => self.status.set(e.to_string()),
            },
            Command::AskPath(_) if self.prompt.is_some() => {
                self.status
                    .set("a path is already being asked for: answer or cancel it first");
            }
            Command::AskPath(request) => self.prompt = Some(PathPrompt::new(request)),
            Command::ExportTo(path) => self.status.set(self.exporter.save_waiting(&path)),
            Command::Status(message) => self.status.set(message),
            Command::PrepareDemo => {
                for &tab in Tab::ALL {
                    self.views.view_mut(tab).prepare_demo();
                }
            }
            Command::PrepareDemoTab(tab) => {
                self.demo_ready = self.prepare_demo_tab(tab).then_some(tab);
            }
        }
    }

    /// The editor's preset as an `attnlab train` line, over the file it is closest to.
    pub(super) fn cli_command(&self) -> crate::Result<String> {
        let (file, base) = self.cli_base()?;
        crate::preset::train_command(&self.editor.preset, &file, &base)
    }

    /// What the command line starts from: the preset's own file while it still loads, else
    /// the shipped preset of the same name (a shipped preset opened from the menu has no
    /// file of its own), else the default one.
    pub(super) fn cli_base(&self) -> crate::Result<(String, Preset)> {
        if let Some(path) = &self.editor.path
            && let Ok(base) = Preset::load(path, &[])
        {
            return Ok((path.display().to_string(), base));
        }
        // By name, which the command line finds from any folder (`experiments::load_preset`).
        let same_name = self.editor.preset.name.replace('-', "_");
        let base = shipped(&same_name).or_else(|_| shipped(DEFAULT_PRESET))?;
        Ok((base.name.to_string(), base.preset(&[])?))
    }
}
