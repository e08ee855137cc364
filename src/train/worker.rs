//! Training on a worker thread: events come back over a channel, a flag stops the run.
//!
//! The consumer (CLI progress bar, GUI) drains `events` without blocking; `waker` is called
//! after each event so a GUI can repaint only when something happened.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;

use super::{Summary, TrainEvent, run};
use crate::Result;
use crate::preset::Preset;

/// A running training.
pub struct TrainHandle {
    pub events: Receiver<TrainEvent>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Summary>>>,
}

impl TrainHandle {
    /// Asks the run to stop; it finishes its current step, saves, and reports `Finished`.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Waits for the thread and returns the run's result.
    pub fn join(mut self) -> Result<Summary> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(crate::Error::Other("the training thread panicked".into())),
            None => Err(crate::Error::Other(
                "the training thread could not be started".into(),
            )),
        }
    }
}

impl Drop for TrainHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts training `preset` into `runs_root` on a new thread.
pub fn spawn(preset: Preset, runs_root: PathBuf, waker: impl Fn() + Send + 'static) -> TrainHandle {
    let (sender, events) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("train {}", preset.name))
        .spawn(move || {
            run::run(&preset, &runs_root, &stop_flag, &mut |event| {
                // A dropped receiver only means nobody listens any more; the run still saves.
                let _ = sender.send(event);
                waker();
            })
        })
        .ok();
    TrainHandle {
        events,
        stop,
        thread,
    }
}
