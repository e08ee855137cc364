//! The window's one background-job service. Analyses, file reads, exports, native dialogs and
//! sweeps all run as named jobs on threads of their own, so the UI never waits for them: each
//! job reports progress (0..1), can be cancelled, and hands its outcome back over a channel that
//! the app drains every frame, whichever view is shown. A job may also tell its view typed
//! messages while it runs ([`Jobs::spawn_telling`]: a sweep's cells as they start and end),
//! which the view drains from its handle ([`Job::messages`]). The status bar lists the live
//! jobs, and says "stopping" for a cancelled one that has not ended yet.
//! Dropping a handle cancels its job: a view that starts a new computation in place of a
//! running one (a slider dragged) stops the old one; [`Jobs::spawn_replacing`] stops every
//! live job of its name, wherever its handle is; [`Job::detach`] lets one run on. Work
//! started with [`Jobs::run`] takes no cancel flag and always runs to its end.
//! (Training runs on the library's own workers, `crate::train::spawn_with`.)

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};

use eframe::egui;

/// What a finished job hands back: its value, `None` when cancelled, or its error.
pub type Outcome<T> = crate::Result<Option<T>>;

/// What every handle of a job shares: its name, progress and cancel flag.
struct State {
    name: String,
    /// Progress as the bits of an f32 in 0..=1.
    progress: AtomicU32,
    cancel: AtomicBool,
    ended: AtomicBool,
}

impl State {
    fn progress(&self) -> f32 {
        f32::from_bits(self.progress.load(Ordering::Relaxed))
    }

    /// The job as the status bar and its progress bar say it: name and progress, or that it
    /// is stopping (cancelled work can take a training step or a cell to notice).
    fn describe(&self) -> String {
        if self.cancel.load(Ordering::Relaxed) {
            format!("{}: stopping…", self.name)
        } else {
            format!("{} {:.0}%", self.name, 100.0 * self.progress())
        }
    }
}

/// What a job's work tells its view while it runs, beside its progress: messages of the
/// view's own type, each waking the UI.
pub struct Tell<M> {
    sender: Sender<M>,
    jobs: Jobs,
}

impl<M> Tell<M> {
    /// Sends `message` to the job's handle (dropped if the handle is gone).
    pub fn send(&self, message: M) {
        let _ = self.sender.send(message);
        self.jobs.wake();
    }
}

/// Marks a job ended when its thread finishes, also by a panic, and wakes the UI to see it.
struct Ended(Arc<State>, Jobs);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended.store(true, Ordering::Relaxed);
        self.1.wake();
    }
}

/// Starts jobs and knows which are live. Cheap to clone: every clone is the same service.
#[derive(Clone, Default)]
pub struct Jobs {
    /// Set on the first frame ([`Jobs::attach`]); jobs started before then wake the UI once
    /// it is known.
    ctx: Arc<OnceLock<egui::Context>>,
    live: Arc<Mutex<Vec<Arc<State>>>>,
}

impl Jobs {
    /// Lets jobs wake `ctx` when they progress or end (called every frame; the first call wins).
    pub fn attach(&self, ctx: &egui::Context) {
        let _ = self.ctx.set(ctx.clone());
    }

    /// Asks for a repaint (from any thread), once the UI is known.
    pub fn wake(&self) {
        if let Some(ctx) = self.ctx.get() {
            ctx.request_repaint();
        }
    }

    /// Runs `work` as a job named `name`: it gets a progress callback (0..1) and the cancel
    /// flag, the shape of the library's analyses (`run_iou`, `run_spectrum`, …), and returns
    /// `Ok(None)` when cancelled.
    pub fn spawn<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        work: impl FnOnce(&mut dyn FnMut(f32), &AtomicBool) -> Outcome<T> + Send + 'static,
    ) -> Job<T> {
        self.spawn_telling(name, move |progress, _: &Tell<()>, cancel| {
            work(progress, cancel)
        })
    }

    /// [`Jobs::spawn`] for work that also tells its view typed messages as it goes ([`Tell`]);
    /// the view drains them with [`Job::messages`]. Every message sent before the work returns
    /// is there to drain once [`Job::poll`] gives the outcome.
    pub fn spawn_telling<T: Send + 'static, M: Send + 'static>(
        &self,
        name: impl Into<String>,
        work: impl FnOnce(&mut dyn FnMut(f32), &Tell<M>, &AtomicBool) -> Outcome<T> + Send + 'static,
    ) -> Job<T, M> {
        let state = Arc::new(State {
            name: name.into(),
            progress: AtomicU32::new(0f32.to_bits()),
            cancel: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let (sender, receiver) = std::sync::mpsc::channel();
        let (tell, messages) = std::sync::mpsc::channel();
        let tell = Tell {
            sender: tell,
            jobs: self.clone(),
        };
        let (shared, jobs) = (state.clone(), self.clone());
        let spawned = std::thread::Builder::new()
            .name(state.name.clone())
            .spawn(move || {
                let ended = Ended(shared.clone(), jobs.clone());
                let mut report = |p: f32| {
                    shared
                        .progress
                        .store(p.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
                    jobs.wake();
                };
                let _ = sender.send(work(&mut report, &tell, &shared.cancel));
                drop(ended);
            });
        if let Err(e) = spawned {
            state.ended.store(true, Ordering::Relaxed);
            let (sender, failed) = std::sync::mpsc::channel();
            let _ = sender.send(Err(crate::Error::Thread {
                name: state.name.clone(),
                cause: e,
            }));
            return Job {
                receiver: failed,
                messages,
                state,
                detached: false,
            };
        }
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(state.clone());
        Job {
            receiver,
            messages,
            state,
            detached: false,
        }
    }

    /// [`Jobs::spawn`] after cancelling every live job of the same name, wherever its handle
    /// is: a computation that restarts on each change of its inputs (an encoding study while
    /// a slider is dragged) never runs twice side by side.
    pub fn spawn_replacing<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        work: impl FnOnce(&mut dyn FnMut(f32), &AtomicBool) -> Outcome<T> + Send + 'static,
    ) -> Job<T> {
        let name = name.into();
        for state in self.live.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if state.name == name {
                state.cancel.store(true, Ordering::Relaxed);
            }
        }
        self.spawn(name, work)
    }

    /// Runs `work`, which neither reports progress nor can be cancelled, as a job.
    pub fn run<T: Send + 'static>(
        &self,
        name: impl Into<String>,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Job<T> {
        self.spawn(name, move |_, _| Ok(Some(work())))
    }

    /// The live jobs, oldest first, each as its name and progress or "stopping" (ended jobs
    /// are forgotten here).
    pub fn live(&self) -> Vec<String> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|s| !s.ended.load(Ordering::Relaxed));
        live.iter().map(|s| s.describe()).collect()
    }
}

/// One job's handle: poll it for the outcome and its messages (`M`, none by default), draw its
/// progress, cancel it. Dropped, it cancels its job (unless detached).
pub struct Job<T, M = ()> {
    receiver: Receiver<Outcome<T>>,
    messages: Receiver<M>,
    state: Arc<State>,
    detached: bool,
}

impl<T, M> Drop for Job<T, M> {
    fn drop(&mut self) {
        if !self.detached {
            self.cancel();
        }
    }
}

impl<T, M> Job<T, M> {
    /// The outcome, once the work has ended.
    pub fn poll(&self) -> Option<Outcome<T>> {
        match self.receiver.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(crate::Error::Internal(format!(
                "{} stopped without a result (its thread panicked)",
                self.state.name
            )))),
        }
    }

    /// The messages the work has told since the last call, oldest first.
    pub fn messages(&self) -> Vec<M> {
        self.messages.try_iter().collect()
    }

    /// Whether it was asked to stop and has not ended yet (buttons say "stopping").
    pub fn is_stopping(&self) -> bool {
        self.state.cancel.load(Ordering::Relaxed) && !self.state.ended.load(Ordering::Relaxed)
    }

    /// Asks the work to stop; it ends with `Ok(None)` at its next check.
    pub fn cancel(&self) {
        self.state.cancel.store(true, Ordering::Relaxed);
    }

    /// Lets the job run to its end with nobody waiting for the outcome (work that reports
    /// back another way, such as an export's status command).
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// A progress bar with the job's name and a Cancel button.
    pub fn ui(&self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            ui.add(
                egui::ProgressBar::new(self.state.progress())
                    .desired_width(220.0)
                    .text(self.state.describe()),
            );
            if ui
                .add_enabled(!self.is_stopping(), egui::Button::new("Cancel"))
                .clicked()
            {
                self.cancel();
            }
        });
    }
}

/// Polls `job` and, when it has ended, clears it and returns its outcome.
pub fn take_finished<T, M>(job: &mut Option<Job<T, M>>) -> Option<Outcome<T>> {
    let outcome = job.as_ref()?.poll()?;
    *job = None;
    Some(outcome)
}

/// The result of `job` once it has ended, which a view shows: the error (or `cancelled`, if
/// given, for a cancelled job) goes to the view's `error` line, a result clears it.
pub fn take_result<T>(
    job: &mut Option<Job<T>>,
    error: &mut Option<String>,
    cancelled: Option<&str>,
) -> Option<T> {
    match take_finished(job)? {
        Ok(Some(value)) => {
            *error = None;
            Some(value)
        }
        Ok(None) => {
            if let Some(message) = cancelled {
                *error = Some(message.to_string());
            }
            None
        }
        Err(e) => {
            *error = Some(e.to_string());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait<T, M>(job: &mut Option<Job<T, M>>) -> Outcome<T> {
        loop {
            if let Some(outcome) = take_finished(job) {
                return outcome;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// [`take_result`] once the job has ended.
    fn result_of<T>(
        mut job: Option<Job<T>>,
        error: &mut Option<String>,
        cancelled: Option<&str>,
    ) -> Option<T> {
        while job
            .as_ref()
            .is_some_and(|t| !t.state.ended.load(Ordering::Relaxed))
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        take_result(&mut job, error, cancelled)
    }

    /// A result clears the view's error line; an error or a named cancellation fills it; an
    /// unnamed cancellation leaves it as it was.
    #[test]
    fn a_finished_task_gives_its_result_or_its_error_to_the_view() {
        let jobs = Jobs::default();
        let mut error = Some("old".to_string());
        let value = result_of(Some(jobs.run("ok", || 5)), &mut error, None);
        assert_eq!((value, error.as_deref()), (Some(5), None));
        let failed = jobs.spawn("fails", |_, _| -> Outcome<u8> {
            Err(crate::Error::Internal("broken".into()))
        });
        assert_eq!(result_of(Some(failed), &mut error, None), None);
        assert!(
            error.as_deref().is_some_and(|e| e.contains("broken")),
            "{error:?}"
        );
        let cancelled = || jobs.spawn("cancelled", |_, _| -> Outcome<u8> { Ok(None) });
        assert_eq!(
            result_of(Some(cancelled()), &mut error, Some("stopped")),
            None
        );
        assert_eq!(error.as_deref(), Some("stopped"));
        error = None;
        assert_eq!(result_of(Some(cancelled()), &mut error, None), None);
        assert_eq!(error, None);
    }

    /// A job that spins until it is cancelled, then says so on the channel returned.
    fn until_cancelled(jobs: &Jobs) -> (Job<()>, std::sync::mpsc::Receiver<()>) {
        let (saw, seen) = std::sync::mpsc::channel();
        let job = jobs.spawn("spin", move |_, cancel| {
            while !cancel.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            let _ = saw.send(());
            Ok(None)
        });
        (job, seen)
    }

    #[test]
    fn dropping_a_handle_cancels_its_task_and_a_detached_one_runs_on() {
        let jobs = Jobs::default();
        let ((first, first_seen), (second, second_seen)) =
            (until_cancelled(&jobs), until_cancelled(&jobs));
        drop(first); // as a view does when a new computation takes the old one's place
        let ten_seconds = std::time::Duration::from_secs(10);
        first_seen
            .recv_timeout(ten_seconds)
            .expect("the dropped job saw its cancel flag");
        assert!(second_seen.try_recv().is_err(), "the kept job runs on");
        drop(second);
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let (done, finished) = std::sync::mpsc::channel();
        jobs.spawn("detached", move |_, cancel| {
            gate.recv().ok();
            let _ = done.send(cancel.load(Ordering::Relaxed));
            Ok(Some(()))
        })
        .detach();
        go.send(()).unwrap();
        assert_eq!(
            finished.recv_timeout(ten_seconds),
            Ok(false),
            "not cancelled"
        );
    }

    #[test]
    fn a_task_hands_back_its_value_and_leaves_the_live_list() {
        let jobs = Jobs::default();
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let mut job = Some(jobs.spawn("sum", move |progress, _| {
            progress(0.5);
            gate.recv().ok();
            Ok(Some(2 + 2))
        }));
        let live = jobs.live();
        assert!(live.len() == 1 && live[0].starts_with("sum "), "{live:?}");
        go.send(()).unwrap();
        assert_eq!(wait(&mut job).unwrap(), Some(4));
        assert!(job.is_none());
        assert!(jobs.live().is_empty());
    }

    /// Messages arrive in order while the job runs, and all of them are there once it has
    /// ended; a cancelled job is listed as stopping until it ends.
    #[test]
    fn a_job_tells_its_view_typed_messages_and_says_when_it_is_stopping() {
        let jobs = Jobs::default();
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let mut job = Some(jobs.spawn_telling("count", move |_, tell, cancel| {
            tell.send("one");
            gate.recv().ok();
            tell.send("two");
            while !cancel.load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            tell.send("three");
            Ok(None::<()>)
        }));
        let handle = job.as_ref().unwrap();
        let mut told = Vec::new();
        while told.is_empty() {
            told.extend(handle.messages());
        }
        assert_eq!(told, ["one"]);
        handle.cancel();
        assert_eq!(jobs.live(), ["count: stopping…"]);
        go.send(()).unwrap();
        assert!(matches!(wait(&mut job), Ok(None)));
        // The handle is gone with the outcome: a view drains before it takes the outcome.
        let mut job = Some(jobs.spawn_telling("last words", |_, tell, _| {
            tell.send(1);
            tell.send(2);
            Ok(Some(()))
        }));
        while !job.as_ref().unwrap().state.ended.load(Ordering::Relaxed) {
            std::thread::yield_now();
        }
        assert_eq!(job.as_ref().unwrap().messages(), [1, 2]);
        assert!(matches!(wait(&mut job), Ok(Some(()))));
    }

    #[test]
    fn a_cancelled_task_ends_with_none() {
        let jobs = Jobs::default();
        let mut job = Some(until_cancelled(&jobs).0);
        job.as_ref().unwrap().cancel();
        assert_eq!(wait(&mut job).unwrap(), None);
    }

    #[test]
    fn a_panicking_task_reports_an_error_naming_it() {
        let jobs = Jobs::default();
        let mut job = Some(jobs.run("doomed", || -> u8 { panic!("on purpose") }));
        let error = wait(&mut job).unwrap_err();
        assert!(
            matches!(&error, crate::Error::Internal(m) if m.contains("doomed")),
            "{error}"
        );
    }

    /// A job started under a live job's name cancels that one, even if its handle is kept
    /// (detached here); a job of another name runs on.
    #[test]
    fn a_replacing_spawn_cancels_the_live_job_of_its_name() {
        let jobs = Jobs::default();
        let spin = |jobs: &Jobs, name: &str| {
            jobs.spawn(name.to_string(), |_, cancel| -> Outcome<u8> {
                while !cancel.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Ok(None)
            })
        };
        let mut old = Some(spin(&jobs, "study"));
        let mut other = Some(spin(&jobs, "export"));
        let mut new = Some(jobs.spawn_replacing("study", |_, _| Ok(Some(7u8))));
        assert!(
            matches!(wait(&mut old), Ok(None)),
            "the old study is cancelled"
        );
        assert!(matches!(wait(&mut new), Ok(Some(7))));
        assert!(!other.as_ref().unwrap().state.cancel.load(Ordering::Relaxed));
        other.take();
    }
}
