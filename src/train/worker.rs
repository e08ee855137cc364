//! Training on a worker thread: events come back over a channel, a flag stops the run.
//!
//! The consumer (CLI progress bar, GUI) drains `events` without blocking; `waker` is called
//! after each event so a GUI can repaint only when something happened.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

use super::{Summary, TrainEvent, run};
use crate::preset::Preset;
use crate::{Error, Result};

/// A running training.
pub struct TrainHandle {
    pub events: Receiver<TrainEvent>,
    stop: Arc<AtomicBool>,
    /// The thread, or why it could not be started (reported by `join`); an `Option` so that
    /// `join` can take it from a handle that implements `Drop`.
    thread: Option<Result<JoinHandle<Result<Summary>>>>,
}

impl TrainHandle {
    /// Asks the run to stop; it finishes its current step, saves, and reports `Finished`.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the thread and returns the run's result.
    pub fn join(mut self) -> Result<Summary> {
        match self.thread.take() {
            Some(Ok(thread)) => thread
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("the training thread panicked".into()))),
            Some(Err(error)) => Err(error),
            None => Err(Error::Internal(
                "the training thread was joined twice".into(),
            )),
        }
    }
}

/// For the window's tests of a run that could not start.
#[cfg(all(test, feature = "gui"))]
impl TrainHandle {
    /// A handle whose thread could not be started, as `spawn` returns it when the system
    /// refuses a thread.
    pub(crate) fn unstarted(error: Error) -> Self {
        let (_, events) = mpsc::channel();
        Self {
            events,
            stop: Arc::default(),
            thread: Some(Err(error)),
        }
    }
}

impl Drop for TrainHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How the training thread competes with the rest of the machine for CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The scheduler's default (the CLI: training is the only work).
    Normal,
    /// Lower priority, so an interactive window on the same cores keeps drawing while
    /// training uses every core. On an otherwise idle machine this costs no speed.
    Background,
}

/// Starts training `preset` into `runs_root` on a new thread, at normal priority.
pub fn spawn(preset: Preset, runs_root: PathBuf, waker: impl Fn() + Send + 'static) -> TrainHandle {
    spawn_with(preset, runs_root, waker, Priority::Normal)
}

/// Starts training `preset` into `runs_root` on a new thread at `priority`.
pub fn spawn_with(
    preset: Preset,
    runs_root: PathBuf,
    waker: impl Fn() + Send + 'static,
    priority: Priority,
) -> TrainHandle {
    // The slug: a NUL in a thread name panics there, before `run` validates the preset.
    let name = format!("train {}", preset.slug());
    spawn_job(name, waker, priority, move |stop, emit| {
        run::run(&preset, &runs_root, stop, emit)
    })
}

/// Continues the stopped or crashed run in `run_dir` ([`run::resume`]) on a new thread.
pub fn spawn_resume(run_dir: PathBuf, waker: impl Fn() + Send + 'static) -> TrainHandle {
    spawn_job(
        "train (resumed)".into(),
        waker,
        Priority::Normal,
        move |stop, emit| run::resume(&run_dir, stop, emit),
    )
}

/// Runs `job` on a thread named `name` at `priority`, its events sent over the channel.
fn spawn_job(
    name: String,
    waker: impl Fn() + Send + 'static,
    priority: Priority,
    job: impl FnOnce(&AtomicBool, &mut dyn FnMut(TrainEvent)) -> Result<Summary> + Send + 'static,
) -> TrainHandle {
    let (sender, events) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if priority == Priority::Background {
                lower_thread_priority();
            }
            let mut emit = |event| {
                // A dropped receiver only means nobody listens any more; the run still saves.
                let _ = sender.send(event);
                waker();
            };
            // A panic is a bug, but whoever follows the run must still hear that it ended
            // and why: without `Failed` the window showed it "running" for ever.
            panic::catch_unwind(AssertUnwindSafe(|| job(&stop_flag, &mut emit))).unwrap_or_else(
                |payload| {
                    let message =
                        format!("the training thread panicked: {}", panic_text(&*payload));
                    emit(TrainEvent::Failed {
                        message: message.clone(),
                        run_dir: None,
                    });
                    Err(Error::Internal(message))
                },
            )
        })
        .map_err(|cause| Error::Thread { name, cause });
    TrainHandle {
        events,
        stop,
        thread: Some(thread),
    }
}

/// What a panic said, when it said it in words (`panic!` with a message does).
pub(crate) fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("no message")
}

/// The environment variable that keeps the window's training at normal priority (`normal`)
/// instead of the lowest (`low`, the default): with another busy program on the machine, a
/// low-priority run gets a sliver of the CPU (a welcome experiment took 6× its stated time).
pub const PRIORITY_VARIABLE: &str = "ATTNLAB_TRAINING_PRIORITY";

/// Whether [`Priority::Background`] lowers the training threads, from
/// [`PRIORITY_VARIABLE`]: unset or `low` yes, `normal` no, anything else an error naming it.
pub fn background_priority_is_low() -> std::result::Result<bool, String> {
    low_priority_from(std::env::var(PRIORITY_VARIABLE).ok().as_deref())
}

/// [`background_priority_is_low`] for the variable's value.
fn low_priority_from(value: Option<&str>) -> std::result::Result<bool, String> {
    match value {
        None | Some("low") => Ok(true),
        Some("normal") => Ok(false),
        Some(other) => Err(format!(
            "{PRIORITY_VARIABLE}={other}: expected low or normal"
        )),
    }
}

/// Lowers the calling thread's scheduling priority to the lowest (nice 19), unless
/// [`PRIORITY_VARIABLE`] says `normal`. Linux keeps the nice value per thread, so the rest of
/// the process is untouched; elsewhere this does nothing.
#[allow(unsafe_code)]
pub fn lower_thread_priority() {
    if background_priority_is_low() != Ok(true) {
        return;
    }
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority only reads its arguments; `who = 0` names the calling thread on Linux.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_training_priority_is_low_unless_asked_for_normal() {
        assert_eq!(low_priority_from(None), Ok(true));
        assert_eq!(low_priority_from(Some("low")), Ok(true));
        assert_eq!(low_priority_from(Some("normal")), Ok(false));
        assert_eq!(
            low_priority_from(Some("high")),
            Err("ATTNLAB_TRAINING_PRIORITY=high: expected low or normal".into())
        );
    }

    /// The GUI hands presets to `spawn` unvalidated: a NUL in the name used to panic starting
    /// the thread instead of failing validation on it.
    #[test]
    fn a_name_with_a_nul_fails_validation_on_the_thread() {
        let preset = Preset {
            name: "a\0b".into(),
            ..Preset::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let handle = spawn(preset, dir.path().to_path_buf(), || {});
        let messages: Vec<String> = handle
            .events
            .iter()
            .map(|event| match event {
                TrainEvent::Failed { message, .. } => message,
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains("control characters"), "{messages:?}");
        assert!(handle.join().is_err());
    }

    #[test]
    fn a_panicking_run_reports_failed_with_the_panic_message() {
        let handle = spawn_job(
            "panics".into(),
            || {},
            Priority::Normal,
            |_, _| panic!("index 9 out of range"),
        );
        let events: Vec<TrainEvent> = handle.events.iter().collect();
        assert!(
            matches!(&events[..], [TrainEvent::Failed { message, run_dir: None }]
                if message == "the training thread panicked: index 9 out of range"),
            "{events:?}"
        );
        assert!(handle.join().is_err());
    }

    #[test]
    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn lowering_priority_affects_only_the_calling_thread() {
        // SAFETY: getpriority only reads its arguments.
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice();
        let lowered = std::thread::spawn(move || {
            lower_thread_priority();
            nice()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, 19.max(before));
        assert_eq!(nice(), before);
    }
}
