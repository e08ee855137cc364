//! Exporting figures: one click per format, a native save dialog as a job (the UI never waits
//! for it), the file written by the same renderers as `attnlab … --figure`; how it went comes
//! back as a status-bar command.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use eframe::egui;

use super::command::{Command, Commands};
use super::jobs::Jobs;
use super::prompt::{self, PathRequest};
use crate::figures::{self, Figure};

/// Runs exports in the background and reports how they went.
pub struct Exporter {
    jobs: Jobs,
    commands: Commands,
    /// Write here without asking (tests, and a user who picked a folder once).
    pub folder: Option<PathBuf>,
    /// The figure waiting for its path to be typed where no file dialog opens
    /// ([`super::prompt`]), then written by [`Self::save_waiting`].
    waiting: Arc<Mutex<Option<Figure>>>,
}

impl Exporter {
    /// Exports run as `jobs` and report to `commands`.
    pub fn new(jobs: Jobs, commands: Commands) -> Self {
        Self {
            jobs,
            commands,
            folder: None,
            waiting: Arc::default(),
        }
    }

    /// A figure's title in bold with its export [`Self::buttons`] after it, wrapped onto a
    /// second line where the column is too narrow (on one line they ran into the next column
    /// at 1024 px).
    pub fn titled(
        &self,
        ui: &mut egui::Ui,
        title: impl Into<egui::RichText>,
        name: &str,
        figure: impl FnOnce() -> Figure,
    ) {
        ui.horizontal_wrapped(|ui| {
            ui.strong(title);
            self.buttons(ui, name, figure);
        });
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
    /// folder is set: in a native dialog, or where none opens in the app's own window.
    pub fn export(&self, figure: Figure, file_name: &str) {
        if let Some(folder) = &self.folder {
            // No dialog to wait for: write now, so a test (or a script) sees the file at once.
            let message = save_message(&figure, &folder.join(file_name));
            self.commands.push(Command::Status(message));
            return;
        }
        let request = |why: &str| PathRequest {
            title: "Export figure".into(),
            default: PathBuf::from(file_name),
            why: why.to_string(),
            answer: Command::ExportTo,
        };
        if let Some(why) = prompt::dialogs_missing() {
            *lock(&self.waiting) = Some(figure);
            self.commands.push(Command::AskPath(request(why)));
            return;
        }
        let (commands, waiting) = (self.commands.clone(), self.waiting.clone());
        let (name, file_name) = (format!("export {file_name}"), file_name.to_string());
        let request = request("");
        let work = move || {
            let pick = || rfd::FileDialog::new().set_file_name(&file_name).save_file();
            let message = match prompt::pick_with(pick) {
                Ok(Some(path)) => save_message(&figure, &path),
                Ok(None) => "export cancelled".to_string(),
                Err(why) => {
                    *lock(&waiting) = Some(figure);
                    commands.push(Command::AskPath(PathRequest {
                        why: why.to_string(),
                        ..request
                    }));
                    return;
                }
            };
            commands.push(Command::Status(message));
        };
        // Its outcome arrives as a command; the handle is not needed.
        self.jobs.run(name, work).detach();
    }

    /// Writes the figure waiting for a typed path to `path`; says how it went.
    pub fn save_waiting(&self, path: &Path) -> String {
        match lock(&self.waiting).take() {
            Some(figure) => save_message(&figure, path),
            None => "no figure is waiting to be exported".into(),
        }
    }
}

/// Writes `figure` to `path`; says how it went, for the status bar.
fn save_message(figure: &Figure, path: &Path) -> String {
    match figures::save(figure, path) {
        Ok(()) => format!("exported {}", path.display()),
        Err(e) => format!("export failed: {e}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figure kept while its path is typed is written there, once.
    #[test]
    fn the_waiting_figure_goes_to_the_typed_path() {
        let jobs = Jobs::default();
        let (commands, _queue) = Commands::new(jobs.clone());
        let exporter = Exporter::new(jobs, commands);
        *lock(&exporter.waiting) = Some(crate::figures::tests::lines_figure());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.svg");
        assert_eq!(
            exporter.save_waiting(&path),
            format!("exported {}", path.display())
        );
        assert!(std::fs::read_to_string(&path).unwrap().contains("<svg"));
        assert_eq!(
            exporter.save_waiting(&path),
            "no figure is waiting to be exported"
        );
    }
}
