//! Sweeps: open a sweep file, train its grid as a job and watch the cells fill in, or
//! collect a finished sweep's folder; then the best-lr summary and the accuracy-vs-d_model panels
//! (the ReBased paper's Figure 1), drawn and exported from the report `attnlab sweep` prints.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use eframe::egui;

use super::super::editor::within;
use super::super::export::Exporter;
use super::super::jobs::{Job, Jobs, take_finished};
use super::super::plot::{PlotOptions, show_figure};
use super::super::runs::{Forwarder, RunFeed};
use super::{View, ViewContext};
use crate::experiments::{Analysis, Experiment};
use crate::figures::Figure;
use crate::report::Report;
use crate::report::sweep::SweepReport;
use crate::sweep::{Eta, Split, Sweep, SweepEvent, collect, mechanism_label, run_sweep};
use crate::train::{RunDir, RunStatus, TrainEvent};

/// How one cell of the grid stands.
#[derive(Clone, Debug, PartialEq)]
pub enum CellState {
    Pending,
    Running {
        step: usize,
        total: usize,
    },
    /// Finished in an earlier session, so not trained again: its best test accuracy.
    Earlier(Option<f64>),
    /// Trained now: its best test accuracy.
    Done(Option<f64>),
    /// Stopped by the user; trained again on the next run.
    Stopped,
    Failed(String),
}

impl CellState {
    fn text(&self) -> String {
        let accuracy = |a: &Option<f64>| a.map_or("-".into(), |a| format!("{a:.2}"));
        match self {
            CellState::Pending => "pending".into(),
            CellState::Running { step, total } => {
                format!(
                    "running {:.0}%",
                    100.0 * *step as f64 / (*total).max(1) as f64
                )
            }
            CellState::Earlier(a) => format!("done (earlier) {}", accuracy(a)),
            CellState::Done(a) => format!("done {}", accuracy(a)),
            CellState::Stopped => RunStatus::Stopped.describe().into(),
            // The reason is on hover: a grid cell is too narrow for it.
            CellState::Failed(_) => RunStatus::Failed.describe().into(),
        }
    }

    /// What hovering the cell of run `id` says: its id, and a failure's reason.
    fn hover(&self, id: &str) -> String {
        match self {
            CellState::Failed(message) => {
                format!("{id}: {}", RunStatus::Failed.explain(Some(message)))
            }
            _ => id.to_string(),
        }
    }

    fn colour(&self, visuals: &egui::Visuals) -> egui::Color32 {
        match self {
            CellState::Pending => visuals.weak_text_color(),
            CellState::Running { .. } => visuals.hyperlink_color,
            CellState::Earlier(_) => egui::Color32::from_rgb(0x2c, 0x80, 0x2c),
            CellState::Done(_) => egui::Color32::from_rgb(0x2c, 0xa0, 0x2c),
            CellState::Stopped => visuals.warn_fg_color,
            CellState::Failed(_) => visuals.error_fg_color,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, CellState::Done(_) | CellState::Earlier(_))
    }

    /// Whether the cell is over for this run of the sweep (done, stopped or failed).
    fn has_ended(&self) -> bool {
        !matches!(self, CellState::Pending | CellState::Running { .. })
    }

    /// The share of the cell trained in this run of the sweep, for the [`Eta`]: a running
    /// cell's steps over its total, all of an ended one.
    fn share_done(&self) -> f64 {
        match *self {
            CellState::Pending => 0.0,
            CellState::Running { step, total } => step as f64 / total.max(1) as f64,
            _ => 1.0,
        }
    }
}

/// A loaded sweep file and where each of its cells sits in the grid.
pub struct Loaded {
    pub file: PathBuf,
    pub sweep: Sweep,
    /// Row labels (mechanism and d_model).
    rows: Vec<String>,
    /// Column labels (the other axes that vary: length and pairs, lr, seed).
    columns: Vec<String>,
    /// (row, column) of each cell.
    place: Vec<(usize, usize)>,
    /// Each axis with its values, as the grid varies them.
    axes: Vec<(&'static str, String)>,
}

/// The axis values of one cell, read from its preset.
struct CellAxes {
    mechanism: String,
    d_model: usize,
    length: String,
    lr: f64,
    seed: u64,
}

/// `values` without repeats, in order of first appearance.
fn distinct<T: PartialEq>(values: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for v in values {
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

fn index_of(values: &[String], value: &str) -> usize {
    values.iter().position(|v| v == value).unwrap_or(0)
}

impl Loaded {
    fn new(file: PathBuf, sweep: Sweep) -> crate::Result<Self> {
        let cells = sweep
            .cells
            .iter()
            .map(|cell| {
                let preset = sweep.preset(cell)?;
                let length = match preset.task.mqar() {
                    Some(c) => format!("L{} N{}", c.seq_len, c.num_kv_pairs),
                    None => format!("L{}", preset.task.seq_len()),
                };
                Ok(CellAxes {
                    mechanism: mechanism_label(&preset),
                    d_model: preset.model.d_model,
                    length,
                    lr: preset.train.lr,
                    seed: preset.train.seed,
                })
            })
            .collect::<crate::Result<Vec<_>>>()?;
        let values = |f: &dyn Fn(&CellAxes) -> String| distinct(cells.iter().map(f));
        let axes: Vec<(&'static str, Vec<String>)> = vec![
            ("mechanism", values(&|c| c.mechanism.clone())),
            ("d_model", values(&|c| c.d_model.to_string())),
            ("length", values(&|c| c.length.clone())),
            ("lr", values(&|c| c.lr.to_string())),
            ("seed", values(&|c| c.seed.to_string())),
        ];
        let varies = |name: &str| axes.iter().any(|(n, v)| *n == name && v.len() > 1);
        let row = |c: &CellAxes| format!("{} d{}", c.mechanism, c.d_model);
        let column = |c: &CellAxes| {
            let mut parts = Vec::new();
            if varies("length") {
                parts.push(c.length.clone());
            }
            if varies("lr") {
                parts.push(format!("lr {}", c.lr));
            }
            if varies("seed") {
                parts.push(format!("seed {}", c.seed));
            }
            if parts.is_empty() {
                "run".into()
            } else {
                parts.join(", ")
            }
        };
        let mut rows = distinct(cells.iter().map(row));
        let mut columns = distinct(cells.iter().map(column));
        let mut place: Vec<(usize, usize)> = cells
            .iter()
            .map(|c| (index_of(&rows, &row(c)), index_of(&columns, &column(c))))
            .collect();
        if distinct(place.iter()).len() < place.len() {
            // Two cells differ only in settings the labels do not show (e.g. two `based`
            // feature dims): one row per cell, named by its id.
            rows = sweep.cells.iter().map(|c| c.id.clone()).collect();
            columns = vec!["status".into()];
            place = (0..rows.len()).map(|i| (i, 0)).collect();
        }
        Ok(Self {
            file,
            axes: axes.into_iter().map(|(n, v)| (n, v.join(", "))).collect(),
            sweep,
            rows,
            columns,
            place,
        })
    }
}

/// What the worker threads tell the view.
enum Message {
    Cell(usize, CellState),
    /// The cells to train, in groups of replicas, how the machine is shared, and each cell's
    /// estimated work.
    Planned(Vec<Vec<usize>>, Split, Vec<f64>),
    /// A group (indices into the planned groups' cells) started training.
    GroupStarted(Vec<usize>),
    /// A sweep or a collection ended: the report of the finished runs, and what went wrong.
    Ended {
        report: Option<SweepReport>,
        error: Option<String>,
    },
}

/// A file or folder chosen in a native dialog.
enum Picked {
    SweepFile(PathBuf),
    Folder(PathBuf),
}

impl Picked {
    fn path(&self) -> &Path {
        match self {
            Picked::SweepFile(path) | Picked::Folder(path) => path,
        }
    }
}

/// A sweep being trained, or a folder being collected.
struct SweepJob {
    /// Tells the grid's changes as [`Message`]s; cancelling it stops training (cells running
    /// stop within a step).
    handle: Job<(), Message>,
    training: bool,
    /// When it started, for the [`Eta`].
    started: std::time::Instant,
}

impl SweepJob {
    /// A job started now; `training` unless it only collects.
    fn new(handle: Job<(), Message>, training: bool) -> Self {
        Self {
            handle,
            training,
            started: std::time::Instant::now(),
        }
    }
}

/// The groups of replicas a sweep trains, as they run.
#[derive(Default)]
pub struct Groups {
    pub groups: Vec<Vec<usize>>,
    pub split: Option<Split>,
    /// Whether each group has started.
    pub started: Vec<bool>,
}

impl Groups {
    /// The line of group `g` in the view: its size, its cells' progress and how it stands.
    fn line(&self, g: usize, cells: &[CellState], loaded: &Loaded) -> (String, String) {
        let members = &self.groups[g];
        let done = members.iter().filter(|&&c| cells[c].is_done()).count();
        let running = members.iter().find_map(|&c| match cells[c] {
            CellState::Running { step, total } => Some((step, total)),
            _ => None,
        });
        let state = match (self.started[g], running) {
            (false, _) => "pending".to_string(),
            (true, Some((step, total))) => format!("running, step {step}/{total}"),
            (true, None) => "ended".to_string(),
        };
        let first = &loaded.sweep.cells[members[0]].id;
        let ids: Vec<&str> = members
            .iter()
            .map(|&c| loaded.sweep.cells[c].id.as_str())
            .collect();
        (
            format!(
                "group {}: {} cells like {first}: {state}, {done} done",
                g + 1,
                members.len()
            ),
            ids.join("\n"),
        )
    }
}

pub struct SweepView {
    /// The sweep file field.
    pub path: String,
    pub loaded: Option<Loaded>,
    pub cells: Vec<CellState>,
    pub groups: Groups,
    /// The work of the cells this run of the sweep trains, and how much of it is done.
    eta: Eta,
    pub report: Option<SweepReport>,
    /// The figure panels of `report` with their file-name suffixes, built once per report.
    panels: Vec<(String, Figure)>,
    pub error: Option<String>,
    job: Option<SweepJob>,
    dialog: Option<Job<Option<Picked>>>,
    shipped: Vec<PathBuf>,
    /// A sweep an experiment of the welcome page loaded, started at the next frame (starting
    /// needs the jobs and the run list, which only the frame has).
    start_pending: bool,
}

impl Default for SweepView {
    fn default() -> Self {
        let (shipped, error) = match shipped_sweeps() {
            Ok(shipped) => (shipped, None),
            Err(e) => (
                Vec::new(),
                Some(format!("the shipped sweeps are unavailable: {e}")),
            ),
        };
        Self {
            path: String::new(),
            loaded: None,
            cells: Vec::new(),
            groups: Groups::default(),
            eta: Eta::default(),
            report: None,
            panels: Vec::new(),
            error,
            job: None,
            dialog: None,
            shipped,
            start_pending: false,
        }
    }
}

/// The shipped sweep files: from `sweeps/` in a checkout, else written out (with their
/// presets) into the system's temporary folder, so the buttons work from any folder.
fn shipped_sweeps() -> crate::Result<Vec<PathBuf>> {
    crate::experiments::shipped_sweeps(&crate::experiments::shipped_dir())
}

/// What a sweep event changes in the view (`totals` remembers each cell's planned steps);
/// `None` for events that change nothing it shows.
fn message(event: SweepEvent, totals: &mut [usize]) -> Option<Message> {
    let (cell, state) = match event {
        SweepEvent::Planned {
            groups,
            split,
            work,
        } => return Some(Message::Planned(groups, split, work)),
        SweepEvent::GroupStarted { cells } => return Some(Message::GroupStarted(cells)),
        other => cell_state(other, totals)?,
    };
    Some(Message::Cell(cell, state))
}

/// The grid state a cell's event puts it in.
fn cell_state(event: SweepEvent, totals: &mut [usize]) -> Option<(usize, CellState)> {
    match event {
        SweepEvent::Planned { .. } | SweepEvent::GroupStarted { .. } => None,
        SweepEvent::Skipped { cell, run_dir } => {
            let best = RunDir::open(&run_dir)
                .and_then(|r| r.read_summary())
                .ok()
                .and_then(|s| s.best_accuracy);
            Some((cell, CellState::Earlier(best)))
        }
        SweepEvent::Train { cell, event } => {
            let state = match event {
                TrainEvent::Started { total_steps, .. } => {
                    totals[cell] = total_steps;
                    CellState::Running {
                        step: 0,
                        total: total_steps,
                    }
                }
                TrainEvent::Step(s) => CellState::Running {
                    step: s.step,
                    total: totals[cell],
                },
                TrainEvent::Eval(_) => return None,
                TrainEvent::Finished(summary) => match summary.status {
                    RunStatus::Completed | RunStatus::TargetReached => {
                        CellState::Done(summary.best_accuracy)
                    }
                    RunStatus::Stopped | RunStatus::Running => CellState::Stopped,
                    RunStatus::Failed => {
                        CellState::Failed(summary.error.clone().unwrap_or_default())
                    }
                },
                TrainEvent::Failed { message, .. } => CellState::Failed(message),
            };
            Some((cell, state))
        }
    }
}

/// Trains `sweep` (on the calling thread, at background priority), telling the grid's changes
/// to `tell` and the share of its cells that have ended to `progress`; at the end writes the
/// report's files into the sweep's folder, as `attnlab sweep` does.
fn train(
    sweep: &Sweep,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(f32),
    (tell, runs): (&dyn Fn(Message), &mut Forwarder),
) {
    crate::train::lower_thread_priority();
    let mut totals = vec![0; sweep.cells.len()];
    let mut ended = 0;
    let result = run_sweep(sweep, stop, &mut |event| {
        if let SweepEvent::Train { cell, event } = &event {
            let preset = || sweep.preset(&sweep.cells[*cell]).unwrap_or_default();
            runs.forward(*cell, event, preset);
        }
        if let Some(message) = message(event, &mut totals) {
            if let Message::Cell(_, state) = &message
                && state.has_ended()
            {
                ended += 1;
                progress(ended as f32 / sweep.cells.len().max(1) as f32);
            }
            tell(message);
        }
    });
    let ended = match result.map(|summary| SweepReport { summary }) {
        Ok(report) => Message::Ended {
            error: report.write(&sweep.out).err().map(|e| e.to_string()),
            report: Some(report),
        },
        // Failed cells: the finished ones still make a summary.
        Err(e) => Message::Ended {
            report: collect(std::slice::from_ref(&sweep.out))
                .ok()
                .map(|summary| SweepReport { summary }),
            error: Some(e.to_string()),
        },
    };
    tell(ended);
}

impl SweepView {
    /// Whether a sweep file is loaded.
    pub fn is_loaded(&self) -> bool {
        self.loaded.is_some()
    }

    pub fn is_running(&self) -> bool {
        self.job.is_some()
    }

    /// Reads and validates a sweep file; an error is shown in the view.
    pub fn load(&mut self, path: &Path) {
        self.path = path.display().to_string();
        match Sweep::load(path).and_then(|sweep| Loaded::new(path.to_path_buf(), sweep)) {
            Ok(loaded) => {
                self.cells = vec![CellState::Pending; loaded.sweep.cells.len()];
                // The last sweep's groups name cells of its own grid.
                self.groups = Groups::default();
                self.loaded = Some(loaded);
                self.set_report(None);
                self.error = None;
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    fn set_report(&mut self, report: Option<SweepReport>) {
        self.panels = report.as_ref().map(Report::figures).unwrap_or_default();
        self.report = report;
    }

    /// Trains the loaded sweep's unfinished cells as a job; its runs join the run list of
    /// `feed` while they train.
    pub fn run(&mut self, jobs: &Jobs, feed: &RunFeed) {
        let Some(loaded) = &self.loaded else { return };
        if self.job.is_some() {
            return;
        }
        let sweep = loaded.sweep.clone();
        let name = format!("sweep {}", sweep.name);
        let mut runs = feed.forwarder(&name);
        let handle = jobs.spawn_telling(name, move |progress, tell, stop| {
            train(&sweep, stop, progress, (&|m| tell.send(m), &mut runs));
            Ok(Some(()))
        });
        self.cells = vec![CellState::Pending; self.cells.len()];
        self.groups = Groups::default();
        self.eta = Eta::default();
        self.set_report(None);
        self.error = None;
        self.job = Some(SweepJob::new(handle, true));
    }

    /// Stops starting cells; the running ones stop within a step.
    pub fn stop(&self) {
        if let Some(job) = &self.job {
            job.handle.cancel();
        }
    }

    /// Summarises the finished runs under `dir` as a job.
    pub fn collect(&mut self, jobs: &Jobs, dir: PathBuf) {
        if self.job.is_some() {
            return;
        }
        let name = format!("collect {}", dir.display());
        let handle = jobs.spawn_telling(name, move |_, tell, _| {
            let (report, error) = match collect(&[dir]) {
                Ok(summary) => (Some(SweepReport { summary }), None),
                Err(e) => (None, Some(e.to_string())),
            };
            tell.send(Message::Ended { report, error });
            Ok(Some(()))
        });
        self.error = None;
        self.job = Some(SweepJob::new(handle, false));
    }

    /// Applies the job's messages; a job whose thread died without its last message ends
    /// with the error that says so.
    fn drain_job(&mut self) {
        let Some(job) = &self.job else { return };
        // Polled first: a job sends its last message before it ends, so once it has ended
        // every message is already queued.
        let ended = job.handle.poll();
        for message in job.handle.messages() {
            self.apply(message);
        }
        if let Some(outcome) = ended {
            if let Err(e) = outcome {
                self.error = Some(e.to_string());
            }
            self.job = None;
        }
    }

    fn apply(&mut self, message: Message) {
        match message {
            Message::Cell(i, state) => {
                self.eta.set_done(i, state.share_done());
                if let Some(cell) = self.cells.get_mut(i) {
                    *cell = state;
                }
            }
            Message::Planned(groups, split, work) => {
                self.eta = Eta::new(&work);
                self.groups = Groups {
                    started: vec![false; groups.len()],
                    groups,
                    split: Some(split),
                };
            }
            Message::GroupStarted(cells) => {
                if let Some(g) = self.groups.groups.iter().position(|g| *g == cells) {
                    self.groups.started[g] = true;
                }
            }
            Message::Ended { report, error } => {
                self.set_report(report);
                self.error = error;
            }
        }
    }

    fn ask(&mut self, jobs: &Jobs, pick: impl FnOnce() -> Option<Picked> + Send + 'static) {
        if self.dialog.is_none() {
            self.dialog = Some(jobs.spawn("file dialog", move |_, _| {
                crate::app::prompt::pick_for_field(pick).map(Some)
            }));
        }
    }

    /// Opens what a dialog picked, unless a sweep started while the dialog was open: loading
    /// another file then would replace the running sweep's grid under it.
    fn take_pick(&mut self, jobs: &Jobs, picked: Picked) {
        if self.job.is_some() {
            self.error = Some(format!(
                "{} was not opened: a sweep is running; stop it first",
                picked.path().display()
            ));
            return;
        }
        match picked {
            Picked::SweepFile(path) => self.load(&path),
            Picked::Folder(dir) => self.collect(jobs, dir),
        }
    }
}

impl View for SweepView {
    /// The small Figure 1 sweep loaded, to show its grid.
    fn prepare_demo(&mut self) -> bool {
        if !self.is_loaded() {
            self.load(Path::new("sweeps/mqar_fig1_small.toml"));
        }
        true
    }

    /// Loads the shipped sweep an experiment names, to start at the next frame; a running
    /// sweep is left alone, with a message.
    fn take_experiment(&mut self, experiment: &Experiment) {
        let Analysis::Sweep(name) = experiment.analysis else {
            return;
        };
        if self.job.is_some() {
            self.error = Some(format!(
                "{name} was not started: a sweep is running; stop it first"
            ));
            return;
        }
        let file = format!("{name}.toml");
        match self.shipped.iter().find(|p| p.ends_with(&file)).cloned() {
            Some(path) => {
                self.load(&path);
                self.start_pending = self.loaded.is_some();
            }
            None => self.error = Some(format!("the shipped sweep {name} is unavailable")),
        }
    }

    /// Picks up the job's messages and dialog answers, and starts a sweep an experiment
    /// loaded.
    fn logic(&mut self, cx: &ViewContext) {
        if std::mem::take(&mut self.start_pending) {
            self.run(cx.jobs, &cx.runs.feed());
        }
        self.drain_job();
        match take_finished(&mut self.dialog) {
            Some(Ok(Some(Some(picked)))) => self.take_pick(cx.jobs, picked),
            Some(Err(e)) => self.error = Some(e.to_string()),
            _ => {}
        }
    }

    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let (jobs, exporter) = (cx.jobs, cx.exporter);
        self.file_ui(ui, jobs);
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        // Vertical only: the wide grid scrolls sideways on its own, so Run and Stop stay in
        // view (scrolling the whole view sideways hid them).
        egui::ScrollArea::vertical().show(ui, |ui| {
            if self.loaded.is_some() {
                self.sweep_ui(ui, cx);
                ui.separator();
            }
            self.summary_ui(ui, exporter);
        });
    }
}

impl SweepView {
    fn file_ui(&mut self, ui: &mut egui::Ui, jobs: &Jobs) {
        let idle = self.job.is_none();
        // Wrapped, here and in the run controls: at 1024 px the shipped sweeps' buttons and
        // the progress ran off the window.
        ui.horizontal_wrapped(|ui| {
            let label = ui.label("sweep file");
            ui.add(egui::TextEdit::singleline(&mut self.path).desired_width(320.0))
                .labelled_by(label.id);
            if ui.add_enabled(idle, egui::Button::new("Load")).clicked() {
                self.load(&PathBuf::from(self.path.clone()));
            }
            if ui.add_enabled(idle, egui::Button::new("Open...")).clicked() {
                self.ask(jobs, || {
                    rfd::FileDialog::new()
                        .add_filter("attnlab sweep", &["toml"])
                        .set_directory("sweeps")
                        .pick_file()
                        .map(Picked::SweepFile)
                });
            }
            let collect = ui
                .add_enabled(idle, egui::Button::new("Collect folder..."))
                .on_hover_text("summarise the finished runs under a folder, without training");
            if collect.clicked() {
                self.ask(jobs, || {
                    rfd::FileDialog::new()
                        .set_directory("runs")
                        .pick_folder()
                        .map(Picked::Folder)
                });
            }
            for path in self.shipped.clone() {
                let name = path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let button = ui.add_enabled(idle, egui::Button::new(name).small());
                if button.on_hover_text(path.display().to_string()).clicked() {
                    self.load(&path);
                }
            }
        });
    }

    /// The loaded sweep: its settings, the run controls, progress and the grid.
    fn sweep_ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let jobs = cx.jobs;
        let running = self.job.as_ref().is_some_and(|j| j.training);
        let Some(loaded) = &mut self.loaded else {
            return;
        };
        ui.strong(format!(
            "{}: {} cells ({})",
            loaded.sweep.name,
            loaded.sweep.cells.len(),
            loaded.file.display()
        ));
        ui.label(format!(
            "base {}, runs into {}",
            loaded.sweep.base.display(),
            loaded.sweep.out.display()
        ));
        for (axis, values) in &loaded.axes {
            ui.label(format!("{axis}: {values}"));
        }
        let mut clicked = (false, false, false);
        ui.horizontal_wrapped(|ui| {
            parallelism_ui(ui, &mut loaded.sweep, running);
            let idle = self.job.is_none();
            clicked.0 = ui
                .add_enabled(idle, egui::Button::new("Run sweep"))
                .on_hover_text("train the unfinished cells; finished ones are kept")
                .clicked();
            let stopping = self.job.as_ref().is_some_and(|j| j.handle.is_stopping());
            let stop = if stopping { "Stopping…" } else { "Stop sweep" };
            clicked.1 = ui
                .add_enabled(running && !stopping, egui::Button::new(stop))
                .on_hover_text("running cells stop within a step and train again next time")
                .clicked();
            clicked.2 = ui
                .add_enabled(idle, egui::Button::new("Collect"))
                .on_hover_text(format!(
                    "summarise the finished runs in {}",
                    loaded.sweep.out.display()
                ))
                .clicked();
            let done = self.cells.iter().filter(|c| c.is_done()).count();
            let total = self.cells.len().max(1);
            let mut text = format!("{done}/{} cells done", self.cells.len());
            if let Some(job) = self.job.as_ref().filter(|j| j.training)
                && let Some(left) = self.eta.seconds_left(job.started.elapsed().as_secs_f64())
            {
                text.push_str(&format!(", eta ~{:.0} min", left / 60.0));
            }
            ui.add(
                egui::ProgressBar::new(done as f32 / total as f32)
                    .desired_width(200.0)
                    .text(text),
            )
            .on_hover_text(
                "The ETA is the time this run of the sweep has taken so far times the work it \
                 has left over the work done: each cell weighs by its estimated arithmetic \
                 (steps x tokens x width), a running cell counts by its steps, and cells \
                 finished earlier are not counted. The last minutes, when some workers have \
                 run out of cells, go slower than it says.",
            );
        });
        egui::ScrollArea::horizontal()
            .id_salt("sweep grid")
            .show(ui, |ui| {
                groups_ui(ui, loaded, &self.groups, &self.cells);
                grid_ui(ui, loaded, &self.cells);
            });
        let out = loaded.sweep.out.clone();
        match clicked {
            (true, _, _) => self.run(jobs, &cx.runs.feed()),
            (_, true, _) => self.stop(),
            (_, _, true) => self.collect(jobs, out),
            _ => {}
        }
    }

    /// The best-lr table and one accuracy plot per length.
    fn summary_ui(&self, ui: &mut egui::Ui, exporter: &Exporter) {
        let Some(SweepReport { summary }) = &self.report else {
            ui.label("Run the sweep, or collect a sweep's folder, to see its summary.");
            return;
        };
        ui.strong(format!(
            "summary: {} finished runs, {} points ({} duplicate runs left out)",
            summary.runs.len(),
            summary.points.len(),
            summary.duplicates
        ));
        egui::Grid::new("sweep-summary")
            .striped(true)
            .show(ui, |ui| {
                for head in [
                    "mechanism",
                    "length",
                    "pairs",
                    "d_model",
                    "best lr",
                    "mean",
                    "std",
                    "seeds",
                    "state",
                ] {
                    ui.strong(head);
                }
                ui.end_row();
                for p in &summary.points {
                    ui.label(&p.mechanism);
                    ui.label(p.seq_len.to_string());
                    ui.label(p.num_kv_pairs.to_string());
                    ui.label(p.d_model.to_string());
                    ui.label(p.best_lr.to_string());
                    ui.label(format!("{:.3}", p.mean));
                    ui.label(format!("{:.3}", p.std));
                    ui.label(p.seeds.to_string());
                    ui.label(p.state_zoology.map_or("n/a".into(), |s| s.to_string()))
                        .on_hover_text("recurrent state in zoology's units (4 x floats)");
                    ui.end_row();
                }
            });
        for why in &summary.unreadable {
            ui.colored_label(ui.visuals().warn_fg_color, format!("left out, unreadable: {why}"));
        }
        if !summary.unfinished.is_empty() {
            ui.weak(format!(
                "left out, not finished: {} run folders",
                summary.unfinished.len()
            ))
            .on_hover_text(summary.unfinished.join("\n"));
        }
        mad_ui(ui, &summary.mad);
        let n = self.panels.len().clamp(1, 3);
        for row in self.panels.chunks(n) {
            ui.columns(n, |columns| {
                for (column, (suffix, figure)) in columns.iter_mut().zip(row) {
                    let name = format!("sweep-accuracy-{suffix}");
                    exporter.titled(column, &figure.title, &name, || figure.clone());
                    let options = PlotOptions {
                        y_range: Some(0.0..=1.0),
                        ..PlotOptions::default()
                    };
                    show_figure(column, figure, &options);
                }
            });
        }
    }
}

/// MAD's score per mechanism and task with the published one beside it, where the sweep ran
/// MAD's probes.
fn mad_ui(ui: &mut egui::Ui, scores: &[crate::sweep::mad::MadScore]) {
    if scores.is_empty() {
        return;
    }
    let rule = crate::sweep::mad::rule(scores);
    ui.strong(format!("MAD score ({rule}, mean over settings)"));
    egui::Grid::new("sweep-mad").striped(true).show(ui, |ui| {
        for head in ["mechanism", "task", "score", "published", "runs", "epoch scale"] {
            ui.strong(head);
        }
        ui.end_row();
        for s in scores {
            ui.label(&s.mechanism);
            ui.label(&s.probe);
            ui.label(format!("{:.3}", s.score));
            let published = crate::sweep::mad::published(&s.mechanism, &s.probe);
            ui.label(published.map_or("-".into(), |(model, p)| format!("{p:.3} ({model})")))
                .on_hover_text("the DeltaNet paper's MAD table (Yang et al. 2024)");
            ui.label(s.runs.to_string());
            ui.label(format!("{}", s.epoch_scale))
                .on_hover_text("the runs' epochs over MAD's 200: below 1, not MAD's protocol");
            ui.end_row();
        }
    });
}

/// The groups of replicas of the running sweep, a line each, with how the machine is shared.
fn groups_ui(ui: &mut egui::Ui, loaded: &Loaded, groups: &Groups, cells: &[CellState]) {
    let Some(split) = groups.split else {
        return;
    };
    let header = format!(
        "{} groups of replicas, {} at a time on {} threads each",
        groups.groups.len(),
        split.workers,
        split.threads
    );
    egui::CollapsingHeader::new(header)
        .id_salt("sweep-groups")
        .default_open(true)
        .show(ui, |ui| {
            for g in 0..groups.groups.len() {
                let (line, members) = groups.line(g, cells, loaded);
                ui.label(line).on_hover_text(members);
            }
        });
}

/// The sweep's workers and replicas, fixed while it trains.
fn parallelism_ui(ui: &mut egui::Ui, sweep: &mut Sweep, running: bool) {
    let label = ui.label("workers");
    ui.add_enabled(
        !running,
        within(egui::DragValue::new(&mut sweep.workers).range(0..=64))
            .custom_formatter(|n, _| {
                if n == 0.0 {
                    "auto".into()
                } else {
                    n.to_string()
                }
            }),
    )
    .labelled_by(label.id)
    .on_hover_text(
        "groups trained at once, each on its share of the cores; auto: one per core, one on a GPU",
    );
    let label = ui.label("replicas");
    ui.add_enabled(
        !running,
        within(egui::DragValue::new(&mut sweep.replicas).range(1..=64)),
    )
    .labelled_by(label.id)
    .on_hover_text(
        "the most cells of one shape trained as one batched model; 1: cell by cell",
    );
}

/// The cells as a table: one row per mechanism and width, one column per other setting.
fn grid_ui(ui: &mut egui::Ui, loaded: &Loaded, cells: &[CellState]) {
    let mut table = vec![vec![None; loaded.columns.len()]; loaded.rows.len()];
    for (i, &(r, c)) in loaded.place.iter().enumerate() {
        table[r][c] = Some(i);
    }
    egui::Grid::new("sweep-cells").striped(true).show(ui, |ui| {
        ui.label("");
        for column in &loaded.columns {
            ui.strong(column);
        }
        ui.end_row();
        for (row, slots) in loaded.rows.iter().zip(&table) {
            ui.strong(row);
            for slot in slots {
                let Some(i) = *slot else {
                    ui.label("");
                    continue;
                };
                let state = &cells[i];
                let text = egui::RichText::new(state.text()).color(state.colour(ui.visuals()));
                ui.label(text)
                    .on_hover_text(state.hover(&loaded.sweep.cells[i].id));
            }
            ui.end_row();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::RunStore;

    /// A sweep loaded after another ran starts without the old one's groups, whose cell
    /// numbers would index past its grid.
    #[test]
    fn loading_a_sweep_forgets_the_last_ones_groups() {
        let mut view = SweepView::default();
        view.groups.groups = vec![vec![10_000]];
        view.groups.started = vec![true];
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/mqar_frontier_small.toml");
        view.load(&file);
        assert_eq!(view.error, None);
        assert!(view.groups.groups.is_empty() && view.groups.started.is_empty());
    }

    /// The ETA weighs the cells by the work the plan gives them: half of a cell of weight 3
    /// and none of one of weight 1 is 3/8 of the work; an ended cell counts whole.
    #[test]
    fn the_eta_follows_the_planned_work_of_the_cells() {
        let mut view = SweepView::default();
        let split = Split {
            workers: 1,
            threads: 1,
        };
        view.apply(Message::Planned(vec![vec![0], vec![1]], split, vec![3.0, 1.0]));
        view.apply(Message::Cell(0, CellState::Running { step: 50, total: 100 }));
        assert_eq!(view.eta.fraction_done(), 0.375);
        view.apply(Message::Cell(1, CellState::Stopped));
        assert_eq!(view.eta.fraction_done(), 0.625);
    }

    /// A sweep's job reports the share of its cells that have ended, one step per cell.
    #[test]
    fn a_sweep_reports_its_progress_cell_by_cell_and_its_runs_to_the_run_list() {
        let root = tempfile::tempdir().unwrap();
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("presets/mqar_softmax.toml");
        let tiny = "model.d_model=8 task.seq_len=8 task.vocab_size=16 task.num_kv_pairs=1 \
                    task.train_examples=16 task.test_examples=8 train.batch_size=8 \
                    train.max_steps=2 train.eval_every=0 train.warmup_steps=1";
        let set: Vec<String> = tiny.split_whitespace().map(|o| format!("{o:?}")).collect();
        let text = format!(
            "name = \"t\"\nbase = {base:?}\nout = {:?}\nworkers = 1\nset = [{}]\n\
             [axes]\nseed = [0, 1, 2, 3]\n",
            root.path().join("out"),
            set.join(", ")
        );
        let file = root.path().join("sweep.toml");
        std::fs::write(&file, text).unwrap();
        let sweep = Sweep::load(&file).unwrap();
        let (sender, messages) = std::sync::mpsc::channel();
        let mut seen = Vec::new();
        let stop = AtomicBool::new(false);
        let mut list = RunStore::new(Jobs::default());
        let mut runs = list.feed().forwarder("sweep t");
        let tell = |m| sender.send(m).unwrap();
        train(&sweep, &stop, &mut |p| seen.push(p), (&tell, &mut runs));
        assert_eq!(seen, [0.25, 0.5, 0.75, 1.0]);
        list.drain();
        assert_eq!(list.runs.len(), 4, "every cell joins the run list");
        assert!(list.runs.iter().all(|r| !r.is_running() && r.dir.is_some()));
        assert_eq!(list.runs[0].trained_by(), None, "ended");
        let ended = messages.try_iter().last();
        assert!(matches!(ended, Some(Message::Ended { error: None, .. })));
    }

    /// The frontier experiment of the welcome page loads its shipped sweep to start at the next
    /// frame; while another sweep runs it is refused in words and the running one stays.
    #[test]
    fn an_experiment_naming_a_sweep_loads_it_to_start() {
        let experiment = crate::experiments::EXPERIMENTS
            .iter()
            .find(|e| matches!(e.analysis, Analysis::Sweep(_)))
            .expect("an experiment runs a sweep");
        let mut view = SweepView::default();
        view.take_experiment(experiment);
        assert_eq!(view.error, None);
        let loaded = view.loaded.as_ref().expect("the sweep is loaded");
        assert_eq!(loaded.sweep.name, "frontier-mixers");
        assert!(view.start_pending);
        let jobs = Jobs::default();
        let mut busy = SweepView {
            job: Some(SweepJob::new(
                jobs.spawn_telling("sweep", |_, _, _| Ok(Some(()))),
                true,
            )),
            ..SweepView::default()
        };
        busy.take_experiment(experiment);
        assert!(!busy.start_pending && busy.loaded.is_none());
        let error = busy.error.unwrap_or_default();
        assert!(error.contains("a sweep is running"), "{error}");
    }

    /// A file picked in a dialog opened before "Run sweep" is refused in words while the
    /// sweep runs, and the running sweep's file stays loaded.
    #[test]
    fn a_pick_arriving_while_a_sweep_runs_is_refused() {
        let jobs = Jobs::default();
        let mut view = SweepView {
            path: "sweeps/running.toml".into(),
            job: Some(SweepJob::new(
                jobs.spawn_telling("sweep", |_, _, _| Ok(Some(()))),
                true,
            )),
            ..SweepView::default()
        };
        view.take_pick(&jobs, Picked::SweepFile("sweeps/other.toml".into()));
        assert_eq!(view.path, "sweeps/running.toml");
        let error = view.error.unwrap_or_default();
        assert!(
            error.contains("sweeps/other.toml was not opened: a sweep is running"),
            "{error}"
        );
    }
}
