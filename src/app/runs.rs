//! The runs the window knows about: live ones (a worker thread reports events) and re-opened
//! ones (read from their run folders). Everything slow happens elsewhere: training on the
//! library's workers, file reads as jobs ([`Jobs`]); the UI only drains channels.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use super::jobs::{Job, Jobs, take_finished};

use crate::Preset;
use crate::attention::AttentionWeights;
use crate::figures::PALETTE_SIZE;
use crate::tasks::lm::Tokens;
use crate::train::run_dir::{AttentionIndex, folder_name};
use crate::train::{
    EvalRecord, MetricRecord, Priority, RunDir, RunStatus, StepRecord, Summary, TrainEvent,
    TrainHandle,
};

/// The saved attention of one evaluation, as plain numbers for the views.
pub struct LoadedAttention {
    pub index: AttentionIndex,
    pub layers: Vec<AttentionWeights>,
}

/// A run folder's preset, metrics and summary (none if it was never written).
type Folder = (Preset, Vec<MetricRecord>, Option<Summary>);

/// Where a run of the list stands: the trainer's status once it is known, and before that
/// what the window is doing with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Started here; the worker has not reported yet.
    Starting,
    /// A run folder being read.
    Loading,
    /// A run folder without a readable summary (killed before its first evaluation).
    NoSummary,
    /// A run folder whose preset or metrics could not be read.
    Unreadable,
    Trainer(RunStatus),
}

/// One run in the run list.
pub struct RunView {
    /// Unique in the list's lifetime (indices shift when runs are removed).
    pub id: u64,
    /// Its palette colour, given as it joins the list and kept while it is there, so that its
    /// curves keep their colour when other runs are selected, ticked or removed
    /// ([`RunStore::next_colour`]).
    pub colour: usize,
    /// Ticked in the run list: its curves are drawn beside the selected run's.
    pub compare: bool,
    pub name: String,
    pub preset: Preset,
    pub dir: Option<PathBuf>,
    pub status: RunState,
    pub steps: Vec<StepRecord>,
    pub evals: Vec<EvalRecord>,
    pub total_steps: usize,
    pub error: Option<String>,
    /// Why the run is not on the device its preset asked for (it fell back to the CPU).
    pub notice: Option<String>,
    /// The text a language model trained on, as its summary names it.
    pub corpus: Option<String>,
    pub attention: Option<LoadedAttention>,
    /// A character-level language model's character of each token id
    /// ([`crate::tasks::lm::LmConfig::characters`]), rebuilt with its first attention from the
    /// text it trained on, so its maps name characters instead of ids; `None` for other tasks
    /// and where that text is not here.
    pub characters: Option<Vec<char>>,
    /// Bumped whenever `attention` changes, so views can cache what they derive from it.
    pub attention_version: u64,
    source: Option<Source>,
    loading: Option<Job<Loaded>>,
}

/// Where a live run's events come from.
enum Source {
    /// A worker the run list started (the editor's Start, an experiment).
    Own(TrainHandle),
    /// Another job that trains it (a sweep, "train and evaluate"), named here.
    Followed {
        events: Receiver<TrainEvent>,
        owner: String,
    },
}

impl Source {
    fn events(&self) -> &Receiver<TrainEvent> {
        match self {
            Self::Own(handle) => &handle.events,
            Self::Followed { events, .. } => events,
        }
    }
}

/// What a background read of a run folder returns.
enum Loaded {
    /// The attention, and the characters of a character-level model where asked for.
    Attention(crate::Result<LoadedAttention>, Option<Vec<char>>),
    Folder(Box<crate::Result<Folder>>),
}

impl RunView {
    /// A run with nothing known of it yet but its name, preset and state.
    fn blank(id: u64, name: String, preset: Preset, status: RunState) -> Self {
        Self {
            id,
            colour: 0,
            compare: false,
            name,
            preset,
            dir: None,
            status,
            steps: Vec::new(),
            evals: Vec::new(),
            total_steps: 0,
            error: None,
            notice: None,
            corpus: None,
            attention: None,
            characters: None,
            attention_version: 0,
            source: None,
            loading: None,
        }
    }

    pub fn is_running(&self) -> bool {
        self.source.is_some()
    }

    /// The job that trains this live run when it is not the run list's own (a sweep):
    /// stopping is done there.
    pub fn trained_by(&self) -> Option<&str> {
        match &self.source {
            Some(Source::Followed { owner, .. }) => Some(owner),
            _ => None,
        }
    }

    /// Why the run cannot be renamed now, if it cannot: its files are being written.
    pub fn rename_refusal(&self) -> Option<String> {
        match self.trained_by() {
            Some(owner) => Some(format!("it is being trained by {owner}")),
            None if self.is_running() => Some("it is training: rename it once it ends".into()),
            None => None,
        }
    }

    /// The state in words, as the run list, the progress bar and the sweep grid say it
    /// ("reached target accuracy", "failed: …"): people read these, not the enum's names.
    pub fn status_text(&self) -> String {
        match self.status {
            RunState::Starting => "starting".into(),
            RunState::Loading => "loading".into(),
            RunState::NoSummary => "no summary".into(),
            // Why, in the list itself (it was "(unreadable)" alone).
            RunState::Unreadable => match &self.error {
                Some(why) => format!("unreadable: {why}"),
                None => "unreadable".into(),
            },
            RunState::Trainer(status) => status.explain(self.error.as_deref()),
        }
    }

    /// Where an ended run stopped, "at step 93 of 496" (a run that reached its target ends
    /// early, so a percentage alone would read as unfinished); `None` before its first step.
    pub fn ended_at(&self) -> Option<String> {
        let last = self.steps.last()?;
        Some(format!("at step {} of {}", last.step, self.total_steps))
    }

    /// How a live run ended, for the status bar: "mqar-softmax: stopped at step 93 of 496", a
    /// failure's reason last ("x: failed at step 9 of 496: out of memory"), not before the step
    /// as if the step were part of it.
    fn end_text(&self) -> String {
        let at = self
            .ended_at()
            .map(|at| format!(" {at}"))
            .unwrap_or_default();
        match (self.status, &self.error) {
            (RunState::Trainer(status @ RunStatus::Failed), Some(why)) => {
                format!("{}: {}{at}: {why}", self.name, status.explain(None))
            }
            _ => format!("{}: {}{at}", self.name, self.status_text()),
        }
    }

    /// Steps done as a fraction of the planned ones.
    pub fn progress(&self) -> f32 {
        let done = self.steps.last().map_or(0, |s| s.step);
        if self.total_steps == 0 {
            0.0
        } else {
            done as f32 / self.total_steps as f32
        }
    }

    /// Asks a live run to stop after its current step.
    pub fn stop(&self) {
        if let Some(Source::Own(handle)) = &self.source {
            handle.stop();
        }
    }

    /// Reads the latest saved attention as a job.
    fn load_attention(&mut self, jobs: &Jobs) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let name = format!("read attention of {}", self.name);
        // Read once, and only from the text the run trained on (`corpus = "auto"` or a path
        // may name other text here, whose characters would be numbered otherwise): without
        // it the ids stay numbers.
        let lm = match (&self.characters, &self.corpus) {
            (None, Some(trained)) => self
                .preset
                .task
                .lm()
                .filter(|lm| lm.tokens == Tokens::Chars)
                .map(|lm| (lm.clone(), trained.clone())),
            _ => None,
        };
        self.loading = Some(jobs.run(name, move || {
            let characters = lm.and_then(|(lm, trained)| {
                let same_text = lm.corpus_description().is_ok_and(|here| here == trained);
                same_text.then(|| lm.characters().ok().flatten()).flatten()
            });
            Loaded::Attention(read_attention(&dir), characters)
        }));
    }
}

/// Every saved layer of a run folder's latest attention.
pub fn read_attention(dir: &Path) -> crate::Result<LoadedAttention> {
    let run = RunDir::open(dir)?;
    let index = run.read_attention_index()?;
    let layers = index
        .layers
        .iter()
        .map(|entry| run.read_attention_weights(entry))
        .collect::<crate::Result<_>>()?;
    Ok(LoadedAttention { index, layers })
}

fn read_folder(dir: &Path) -> crate::Result<Folder> {
    let run = RunDir::open(dir)?;
    Ok((
        run.read_preset()?,
        run.read_metrics()?,
        run.read_summary().ok(),
    ))
}

/// A run trained by another job, handed to the run list.
struct Followed {
    preset: Preset,
    events: Receiver<TrainEvent>,
    owner: String,
}

/// Where jobs that train (a sweep, "train and evaluate") hand their runs to the run list, from
/// any thread, so every training shows in the list while it trains. Cheap to clone.
#[derive(Clone)]
pub struct RunFeed {
    sender: Sender<Followed>,
    jobs: Jobs,
}

impl RunFeed {
    /// The forwarder of the runs one job named `owner` trains.
    pub fn forwarder(&self, owner: impl Into<String>) -> Forwarder {
        Forwarder {
            feed: self.clone(),
            owner: owner.into(),
            live: HashMap::new(),
        }
    }
}

/// Passes the training events of one job's runs (told apart by a key: a sweep's cell, a
/// preset's index) to the run list: a run joins the list at its `Started` and leaves the
/// forwarder after its last event.
pub struct Forwarder {
    feed: RunFeed,
    owner: String,
    live: HashMap<usize, Sender<TrainEvent>>,
}

impl Forwarder {
    /// Forwards `event` of run `key`, whose preset `preset` gives when it starts.
    pub fn forward(&mut self, key: usize, event: &TrainEvent, preset: impl FnOnce() -> Preset) {
        if matches!(event, TrainEvent::Started { .. }) {
            let (sender, events) = std::sync::mpsc::channel();
            let followed = Followed {
                preset: preset(),
                events,
                owner: self.owner.clone(),
            };
            // The receiver lives as long as the app; a send fails only while it shuts down.
            let _ = self.feed.sender.send(followed);
            self.live.insert(key, sender);
        }
        if let Some(sender) = self.live.get(&key) {
            let _ = sender.send(event.clone());
            self.feed.jobs.wake();
        }
        if matches!(event, TrainEvent::Finished(_) | TrainEvent::Failed { .. }) {
            self.live.remove(&key);
        }
    }
}

/// The run list.
pub struct RunStore {
    pub runs: Vec<RunView>,
    pub selected: Option<usize>,
    jobs: Jobs,
    next_id: u64,
    feed: RunFeed,
    followed: Receiver<Followed>,
}

impl RunStore {
    /// An empty list whose folder reads run as `jobs`.
    pub fn new(jobs: Jobs) -> Self {
        let (sender, followed) = std::sync::mpsc::channel();
        Self {
            runs: Vec::new(),
            selected: None,
            feed: RunFeed {
                sender,
                jobs: jobs.clone(),
            },
            jobs,
            next_id: 0,
            followed,
        }
    }

    /// Where jobs that train hand their runs to this list.
    pub fn feed(&self) -> RunFeed {
        self.feed.clone()
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Starts training `preset` into `root`; every event of its worker wakes the UI. Returns
    /// the new run's id.
    pub fn start(&mut self, preset: Preset, root: PathBuf) -> u64 {
        let jobs = self.jobs.clone();
        let repaint = move || jobs.wake();
        let handle = crate::train::spawn_with(preset.clone(), root, repaint, Priority::Background);
        self.push_live(preset, handle)
    }

    /// Adds the run `handle` trains, selected, and returns its id.
    fn push_live(&mut self, preset: Preset, handle: TrainHandle) -> u64 {
        let id = self.push_source(preset, Source::Own(handle));
        self.selected = Some(self.runs.len() - 1);
        id
    }

    /// Adds a live run whose events come from `source`, and returns its id.
    fn push_source(&mut self, preset: Preset, source: Source) -> u64 {
        let id = self.new_id();
        let name = preset.name.clone();
        self.runs.push(RunView {
            source: Some(source),
            colour: self.next_colour(),
            ..RunView::blank(id, name, preset, RunState::Starting)
        });
        id
    }

    /// Adds a run folder to the list; its files are read as a job.
    pub fn open(&mut self, dir: PathBuf) {
        if self
            .runs
            .iter()
            .any(|r| r.dir.as_deref() == Some(dir.as_path()))
        {
            return;
        }
        let folder = dir.clone();
        let loading = self.jobs.run(format!("read {}", dir.display()), move || {
            Loaded::Folder(Box::new(read_folder(&folder)))
        });
        let name = folder_name(&dir);
        let id = self.new_id();
        self.runs.push(RunView {
            dir: Some(dir),
            loading: Some(loading),
            colour: self.next_colour(),
            ..RunView::blank(id, name, Preset::default(), RunState::Loading)
        });
        if self.selected.is_none() {
            self.selected = Some(self.runs.len() - 1);
        }
    }

    /// Drops run `index` from the list (not its folder); a live run is never removed.
    pub fn remove(&mut self, index: usize) {
        if self.runs.get(index).is_none_or(RunView::is_running) {
            return;
        }
        self.runs.remove(index);
        self.selected = match self.selected {
            Some(s) if s == index => self.runs.len().checked_sub(1),
            Some(s) if s > index => Some(s - 1),
            other => other,
        };
    }

    pub fn selected(&self) -> Option<&RunView> {
        self.selected.and_then(|i| self.runs.get(i))
    }

    /// The colour a run joining the list takes: of the palette's, the one fewest runs of the
    /// list hold, the first of those (a free one while there are fewer runs than colours).
    fn next_colour(&self) -> usize {
        (0..PALETTE_SIZE)
            .min_by_key(|&c| self.runs.iter().filter(|r| r.colour == c).count())
            .unwrap_or(0)
    }

    /// The runs whose curves are drawn: the selected one first, then every ticked one.
    pub fn shown(&self) -> Vec<&RunView> {
        let ticked = self
            .runs
            .iter()
            .enumerate()
            .filter(|&(i, r)| r.compare && self.selected != Some(i))
            .map(|(_, r)| r);
        self.selected().into_iter().chain(ticked).collect()
    }

    /// Applies everything the workers and loaders sent since the last frame; returns how each
    /// run the window itself trained ended meanwhile, so that the status bar replaces a
    /// "stopping …" that would otherwise stay up after the run had stopped. Runs followed from
    /// a sweep are left out: a sweep's cells end by the dozen, and its own view says so.
    pub fn drain(&mut self) -> Vec<String> {
        while let Ok(followed) = self.followed.try_recv() {
            let source = Source::Followed {
                events: followed.events,
                owner: followed.owner,
            };
            self.push_source(followed.preset, source);
            self.selected.get_or_insert(self.runs.len() - 1);
        }
        let mut ended = Vec::new();
        for run in &mut self.runs {
            let own = matches!(run.source, Some(Source::Own(_)));
            if drain_events(run, &self.jobs) && own {
                ended.push(run.end_text());
            }
            drain_loads(run, &self.jobs);
        }
        ended
    }

    /// Run folders of the list, for persistence.
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.runs.iter().filter_map(|r| r.dir.clone()).collect()
    }
}

/// Applies a live run's events; true if it ended.
fn drain_events(run: &mut RunView, jobs: &Jobs) -> bool {
    let Some(source) = &run.source else {
        return false;
    };
    let mut ended = false;
    let mut evaluated = false;
    loop {
        match source.events().try_recv() {
            Ok(TrainEvent::Started {
                run_dir,
                total_steps,
                device_notice,
                precision_note,
                corpus,
                ..
            }) => {
                run.dir = Some(run_dir);
                run.corpus = corpus;
                run.total_steps = total_steps;
                run.notice = match (device_notice, precision_note) {
                    (Some(device), Some(precision)) => Some(format!("{device}; {precision}")),
                    (device, precision) => device.or(precision),
                };
                run.status = RunState::Trainer(RunStatus::Running);
            }
            Ok(TrainEvent::Step(step)) => run.steps.push(step),
            Ok(TrainEvent::Eval(eval)) => {
                run.evals.push(eval);
                evaluated = true;
            }
            Ok(TrainEvent::Finished(summary)) => {
                run.status = RunState::Trainer(summary.status);
                run.error = summary.error;
                ended = true;
            }
            Ok(TrainEvent::Failed { message, run_dir }) => {
                run.status = RunState::Trainer(RunStatus::Failed);
                run.error = Some(message);
                if run_dir.is_some() {
                    run.dir = run_dir;
                }
                ended = true;
            }
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                if !ended {
                    report_silent_end(run);
                }
                ended = true;
                break;
            }
        }
    }
    if evaluated {
        run.load_attention(jobs);
    }
    if ended {
        run.source = None;
    }
    ended
}

/// A worker that hung up without `Finished` or `Failed` never ran (its thread could not be
/// started): its handle says why. Without this the run stayed "starting" with no message. A
/// followed run whose job ended first (it failed or was stopped) says so.
fn report_silent_end(run: &mut RunView) {
    let handle = match run.source.take() {
        Some(Source::Own(handle)) => handle,
        Some(Source::Followed { owner, .. }) => {
            run.status = RunState::Trainer(RunStatus::Stopped);
            run.error = Some(format!("{owner} ended before this run reported its end"));
            return;
        }
        None => return,
    };
    match handle.join() {
        Ok(summary) => {
            run.status = RunState::Trainer(summary.status);
            run.error = summary.error;
        }
        Err(error) => {
            run.status = RunState::Trainer(RunStatus::Failed);
            run.error = Some(error.to_string());
        }
    }
}

fn drain_loads(run: &mut RunView, jobs: &Jobs) {
    let loaded = match take_finished(&mut run.loading) {
        Some(Ok(Some(loaded))) => loaded,
        Some(Err(e)) => {
            run.error = Some(e.to_string());
            return;
        }
        Some(Ok(None)) | None => return,
    };
    match loaded {
        Loaded::Folder(folder) => apply_folder(run, *folder, jobs),
        Loaded::Attention(Ok(attention), characters) => {
            run.attention = Some(attention);
            run.characters = characters.or(run.characters.take());
            run.attention_version += 1;
        }
        // A run stopped before its first evaluation has no attention yet: not an error.
        Loaded::Attention(Err(_), _) => {}
    }
}

fn apply_folder(run: &mut RunView, folder: crate::Result<Folder>, jobs: &Jobs) {
    match folder {
        Ok((preset, metrics, summary)) => {
            run.name = preset.name.clone();
            run.preset = preset;
            run.status = summary
                .as_ref()
                .map_or(RunState::NoSummary, |s| RunState::Trainer(s.status));
            if let Some(summary) = summary {
                run.notice = summary.device_notice;
                run.corpus = summary.corpus;
                run.error = summary.error;
            }
            (run.steps, run.evals) = MetricRecord::split(metrics);
            run.total_steps = run.steps.last().map_or(0, |s| s.step);
            run.load_attention(jobs);
        }
        Err(e) => {
            run.status = RunState::Unreadable;
            run.error = Some(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_thread_never_started_fails_with_the_reason() {
        let mut store = RunStore::new(Jobs::default());
        let cause = std::io::Error::other("no more threads");
        let handle = TrainHandle::unstarted(crate::Error::Thread {
            name: "train mqar".into(),
            cause,
        });
        store.push_live(Preset::default(), handle);
        assert_eq!(store.runs[0].status_text(), "starting");
        let ended = store.drain();
        let run = &store.runs[0];
        assert!(!run.is_running());
        assert_eq!(run.status, RunState::Trainer(RunStatus::Failed));
        let error = run.error.as_deref().unwrap_or_default();
        assert!(error.contains("no more threads"), "{error}");
        // The status bar's line: the run, how it ended, then why.
        assert_eq!(ended, [format!("{}: failed: {error}", run.name)]);
    }

    /// A failure's reason comes after the step it failed at, not before it.
    #[test]
    fn a_failed_runs_end_names_its_step_before_its_reason() {
        let mut run = RunView::blank(0, "x".into(), Preset::default(), RunState::Loading);
        (run.status, run.error) = (
            RunState::Trainer(RunStatus::Failed),
            Some("out of memory".into()),
        );
        run.total_steps = 496;
        run.steps.push(crate::train::StepRecord {
            step: 9,
            epoch: 0.1,
            loss: 1.0,
            lr: 1e-3,
            grad_norm: 1.0,
            tokens_per_s: 1.0,
            elapsed_secs: 1.0,
        });
        assert_eq!(run.end_text(), "x: failed at step 9 of 496: out of memory");
        run.status = RunState::Trainer(RunStatus::Stopped);
        assert_eq!(run.end_text(), "x: stopped at step 9 of 496");
    }

    /// A run another job trains joins the list at its start, says who stops it, and ends
    /// with a message when that job ends without the run's last event.
    #[test]
    fn a_followed_run_joins_at_its_start_and_ends_with_its_job() {
        let mut store = RunStore::new(Jobs::default());
        let mut forwarder = store.feed().forwarder("sweep s");
        let started = TrainEvent::Started {
            run_dir: PathBuf::from("runs/cell"),
            total_steps: 10,
            steps_per_epoch: 5,
            n_params: 1,
            device_notice: None,
            precision_note: None,
            corpus: None,
        };
        forwarder.forward(3, &started, Preset::default);
        store.drain();
        let run = &store.runs[0];
        assert!(run.is_running());
        assert_eq!(run.trained_by(), Some("sweep s"));
        assert_eq!(run.dir.as_deref(), Some(Path::new("runs/cell")));
        drop(forwarder);
        let ended = store.drain();
        assert!(
            ended.is_empty(),
            "a sweep's cells stay out of the status bar"
        );
        let run = &store.runs[0];
        assert!(!run.is_running());
        let error = run.error.as_deref().unwrap_or_default();
        assert!(error.contains("sweep s ended"), "{error}");
    }
}
