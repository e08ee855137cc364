//! The window's command queue: menus, shortcuts, views and background jobs (a dialog's answer,
//! a finished export) push a [`Command`]; the app drains the queue once per frame in `logic()`,
//! before anything is drawn, so every change to the window's state has one place where it
//! happens, whichever view or thread asked for it.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender};

use super::jobs::Jobs;
use super::views::Tab;

/// Something the app does between frames.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Train the editor's preset.
    Start,
    /// Stop the selected run after its current step.
    Stop,
    /// Replace the editor's preset with the default one (asking about unsaved changes).
    NewPreset,
    /// Ask for a preset file, then open it.
    AskOpenPreset,
    /// Load a preset file into the editor (asking about unsaved changes).
    OpenPreset(PathBuf),
    /// Save to the preset's own file, or ask for one if it has none.
    Save,
    /// Ask for a file name, then save there.
    AskSavePreset,
    /// Write the editor's preset to this file.
    SavePreset(PathBuf),
    /// Ask for a run folder, then open it.
    AskOpenRun,
    /// Add a run folder to the run list.
    OpenRun(PathBuf),
    /// Name the run of this id (its [`super::RunView::id`]) anew, in its folder's files.
    RenameRun(u64, String),
    /// Ask for a Hugging Face model folder, then open it.
    AskOpenModel,
    /// Open a pretrained model's folder in the Pretrained view, and show it.
    OpenModel(PathBuf),
    /// Load a shipped preset (compiled in) into the editor (asking about unsaved changes).
    OpenShipped(&'static str),
    /// Run experiment `i` of [`crate::experiments::EXPERIMENTS`]: load its first preset into
    /// the editor, train its presets, show its view, and start its analysis when they end.
    RunExperiment(usize),
    /// Show a view.
    Show(Tab),
    /// Show or hide the keyboard shortcuts overlay.
    ToggleShortcuts,
    /// Copy the editor's preset to the clipboard as an `attnlab train … --set …` line.
    CopyCliCommand,
    /// Ask for a path in the app's own window (no native file dialog opens here).
    AskPath(super::prompt::PathRequest),
    /// Write the figure waiting in the exporter to this file.
    ExportTo(PathBuf),
    /// Put a message in the status bar.
    Status(String),
    /// For the screenshot demo: let every view set up what it shows by itself.
    PrepareDemo,
    /// For the screenshot demo: get this view ready to be captured (its analysis computed);
    /// [`super::AttnlabApp::demo_ready`] says when it is.
    PrepareDemoTab(Tab),
}

/// Where commands are pushed from (any thread). Cheap to clone.
#[derive(Clone)]
pub struct Commands {
    sender: Sender<Command>,
    jobs: Jobs,
}

impl Commands {
    /// A queue whose pushes wake the UI through `jobs`, and the receiving end the app drains.
    pub fn new(jobs: Jobs) -> (Self, Receiver<Command>) {
        let (sender, receiver) = std::sync::mpsc::channel();
        (Self { sender, jobs }, receiver)
    }

    /// Queues `command` for the next `logic()`.
    pub fn push(&self, command: Command) {
        // The receiver lives as long as the app; a send fails only while it shuts down.
        let _ = self.sender.send(command);
        self.jobs.wake();
    }
}
