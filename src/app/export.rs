//! Exporting figures: one click per format, a native save dialog as a job (the UI never waits
//! for it), the file written by the same renderers as `attnlab … --figure`; how it went comes
//! back as a status-bar command.

use std::path::PathBuf;

use eframe::egui;

use super::command::{Command, Commands};
use super::jobs::Jobs;
use crate::figures::{self, Figure};

/// Runs exports in the background and reports how they went.
pub struct Exporter {
    jobs: Jobs,
    commands: Commands,
    /// Write here without asking (tests, and a user who picked a folder once).
    pub folder: Option<PathBuf>,
}

impl Exporter {
    /// Exports run as `jobs` and report to `commands`.
    pub fn new(jobs: Jobs, commands: Commands) -> Self {
        Self {
            jobs,
            commands,
            folder: None,
        }
    }

    /// PNG / SVG / CSV buttons for `figure` (built only when a button is clicked).
    pub fn buttons(&self, ui: &mut egui::Ui, name: &str, figure: impl FnOnce() -> Figure) {
        let mut clicked = None;
        for extension in ["png", "svg", "csv"] {
            let label = extension.to_uppercase();
            if ui
                .small_button(&label)
                .on_hover_text(format!("export {name} as {label}"))
                .clicked()
            {
                clicked = Some(extension);
            }
        }
        if let Some(extension) = clicked {
            self.export(figure(), &format!("{name}.{extension}"));
        }
    }

    /// Saves `figure` as `file_name` (its extension picks the format), asking where unless a
    /// folder is set.
    pub fn export(&self, figure: Figure, file_name: &str) {
        let commands = self.commands.clone();
        let folder = self.folder.clone();
        let file_name = file_name.to_string();
        let name = format!("export {file_name}");
        let work = move || {
            let path = match folder {
                Some(folder) => Some(folder.join(&file_name)),
                None => rfd::FileDialog::new().set_file_name(&file_name).save_file(),
            };
            let message = match path {
                None => "export cancelled".to_string(),
                Some(path) => match figures::save(&figure, &path) {
                    Ok(()) => format!("exported {}", path.display()),
                    Err(e) => format!("export failed: {e}"),
                },
            };
            commands.push(Command::Status(message));
        };
        if self.folder.is_some() {
            // No dialog to wait for: write now, so a test (or a script) sees the file at once.
            work();
        } else {
            // Its outcome arrives as a command; the handle is not needed.
            self.jobs.run(name, work).detach();
        }
    }
}
