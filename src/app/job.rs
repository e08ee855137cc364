//! A long analysis on a worker thread: the UI polls its result each frame, draws its progress and
//! can cancel it. The work function gets a progress callback (0..1) and the cancel flag, the same
//! shape as the library's analyses (`run_iou`, `run_spectrum`, …), and returns `Ok(None)` when
//! cancelled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

use eframe::egui;

/// What a finished job hands back: its value, `None` when cancelled, or its error.
pub type Outcome<T> = crate::Result<Option<T>>;

pub struct Job<T> {
    receiver: Receiver<Outcome<T>>,
    /// Progress as the bits of an f32 in 0..=1.
    progress: Arc<AtomicU32>,
    cancel: Arc<AtomicBool>,
    label: String,
}

impl<T: Send + 'static> Job<T> {
    /// Starts `work` on a new thread; `ctx` is repainted on progress and at the end.
    pub fn spawn(
        label: impl Into<String>,
        ctx: &egui::Context,
        work: impl FnOnce(&mut dyn FnMut(f32), &AtomicBool) -> Outcome<T> + Send + 'static,
    ) -> Self {
        let (sender, receiver) = std::sync::mpsc::channel();
        let progress = Arc::new(AtomicU32::new(0f32.to_bits()));
        let cancel = Arc::new(AtomicBool::new(false));
        let (shared, flag, ctx) = (progress.clone(), cancel.clone(), ctx.clone());
        std::thread::spawn(move || {
            let mut report = |p: f32| {
                shared.store(p.clamp(0.0, 1.0).to_bits(), Ordering::Relaxed);
                ctx.request_repaint();
            };
            let _ = sender.send(work(&mut report, &flag));
            ctx.request_repaint();
        });
        Self {
            receiver,
            progress,
            cancel,
            label: label.into(),
        }
    }

    /// The outcome, once the work has ended.
    pub fn poll(&self) -> Option<Outcome<T>> {
        match self.receiver.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(crate::Error::Other(format!(
                "{} stopped without a result (the worker thread panicked)",
                self.label
            )))),
        }
    }

    /// A progress bar with the job's label and a Cancel button.
    pub fn ui(&self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let progress = f32::from_bits(self.progress.load(Ordering::Relaxed));
            ui.add(
                egui::ProgressBar::new(progress)
                    .desired_width(220.0)
                    .text(format!("{} {:.0}%", self.label, 100.0 * progress)),
            );
            if ui.button("Cancel").clicked() {
                self.cancel.store(true, Ordering::Relaxed);
            }
        });
    }
}

/// Polls `job` and, when it has ended, clears it and returns its outcome.
pub fn take_finished<T: Send + 'static>(job: &mut Option<Job<T>>) -> Option<Outcome<T>> {
    let outcome = job.as_ref()?.poll()?;
    *job = None;
    Some(outcome)
}
