//! Typing a path where no file dialog opens. rfd's dialogs on Linux ask the XDG desktop portal
//! over the D-Bus session bus, or run `zenity`; without either they return at once as if
//! cancelled, so Save as, Open run and Export did nothing and said "export cancelled". The app
//! asks for the path in its own window instead, saying what is missing.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use eframe::egui;

use super::command::Command;

/// A dialog answered faster than this was not seen by anyone: it did not open.
const UNSEEN: Duration = Duration::from_millis(400);

/// What to ask for, and what to do with the answer.
#[derive(Clone, Debug)]
pub struct PathRequest {
    /// The window's title, e.g. "Open run folder".
    pub title: String,
    /// The path the field starts with.
    pub default: PathBuf,
    /// Why the native dialog is not used.
    pub why: String,
    /// The command the typed path becomes.
    pub answer: fn(PathBuf) -> Command,
}

/// Equal when they ask the same and answer with the same command (function pointers do not
/// compare reliably; the commands they make do).
impl PartialEq for PathRequest {
    fn eq(&self, other: &Self) -> bool {
        let answer = |r: &Self| (r.answer)(PathBuf::new());
        (&self.title, &self.default, &self.why) == (&other.title, &other.default, &other.why)
            && answer(self) == answer(other)
    }
}

/// The path window's state while it is open.
pub struct PathPrompt {
    request: PathRequest,
    text: String,
}

impl PathPrompt {
    pub fn new(request: PathRequest) -> Self {
        let text = request.default.display().to_string();
        Self { request, text }
    }

    /// Draws the window; returns the command to run once it is answered (`Some(None)`: cancelled).
    pub fn ui(&mut self, ctx: &egui::Context) -> Option<Option<Command>> {
        let mut outcome = None;
        egui::Window::new(self.request.title.as_str())
            .collapsible(false)
            .resizable(false)
            .show(ctx, |ui| {
                ui.colored_label(ui.visuals().warn_fg_color, &self.request.why);
                let label = ui.label("path");
                let field = ui
                    .add(egui::TextEdit::singleline(&mut self.text).desired_width(420.0))
                    .labelled_by(label.id);
                let entered = field.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
                ui.horizontal(|ui| {
                    let typed = !self.text.trim().is_empty();
                    if ui.add_enabled(typed, egui::Button::new("OK")).clicked() || entered && typed
                    {
                        let path = PathBuf::from(self.text.trim());
                        outcome = Some(Some((self.request.answer)(path)));
                    }
                    if ui.button("Cancel").clicked() {
                        outcome = Some(None);
                    }
                });
            });
        outcome
    }
}

/// Why no native file dialog can open here, if none can: on Linux, neither a D-Bus session bus
/// (for the desktop portal) nor `zenity` on the `PATH`. Checked once.
pub fn dialogs_missing() -> Option<&'static str> {
    static MISSING: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *MISSING.get_or_init(|| dialogs_missing_in(|name| std::env::var_os(name)))
}

/// [`dialogs_missing`] with the environment variable `var`.
fn dialogs_missing_in(var: impl Fn(&str) -> Option<OsString>) -> Option<&'static str> {
    let bus = var("DBUS_SESSION_BUS_ADDRESS").is_some()
        || var("XDG_RUNTIME_DIR").is_some_and(|dir| Path::new(&dir).join("bus").exists());
    let zenity = var("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join("zenity").is_file()));
    (cfg!(target_os = "linux") && !bus && !zenity).then_some(
        "No file dialog can open here: there is neither a desktop portal (no D-Bus session bus) \
         nor zenity. Type the path instead.",
    )
}

/// A native dialog `pick` of a view that has a path field of its own beside its button: when
/// no dialog can open, or it never opened, an error that says so (the view shows it).
pub fn pick_for_field<T>(pick: impl FnOnce() -> Option<T>) -> crate::Result<Option<T>> {
    let failed = |why: &str| crate::Error::Failed(why.replace("the path", "the path in its field"));
    match dialogs_missing() {
        Some(why) => Err(failed(why)),
        None => pick_with(pick).map_err(failed),
    }
}

/// Runs the native dialog `pick`; `None` when it was cancelled, `Err` with why when it never
/// opened (it answered before anyone could have seen it).
pub fn pick_with<T>(
    pick: impl FnOnce() -> Option<T>,
) -> std::result::Result<Option<T>, &'static str> {
    let started = Instant::now();
    match pick() {
        Some(path) => Ok(Some(path)),
        // rfd's Linux backends fail this way; elsewhere the system's own dialog always opens.
        None if cfg!(target_os = "linux") && started.elapsed() < UNSEEN => Err(
            "The file dialog closed as soon as it opened (no desktop portal or zenity here?). \
             Type the path instead.",
        ),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialog_that_answers_at_once_did_not_open() {
        assert!(pick_with(|| None::<PathBuf>).is_err());
        let chosen = pick_with(|| Some(PathBuf::from("a.toml")));
        assert_eq!(chosen, Ok(Some(PathBuf::from("a.toml"))));
        let cancelled = pick_with(|| -> Option<PathBuf> {
            std::thread::sleep(UNSEEN);
            None
        });
        assert_eq!(cancelled, Ok(None));
    }

    /// Without a D-Bus session bus and without zenity no dialog can open (on Linux): the
    /// window says so and offers its path field; either one is enough for rfd.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_machine_without_portal_or_zenity_has_no_file_dialog() {
        let (runtime, bin) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let env = |vars: Vec<(&'static str, OsString)>| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.clone())
            }
        };
        let bare = || {
            vec![
                ("XDG_RUNTIME_DIR", runtime.path().into()),
                ("PATH", bin.path().into()),
            ]
        };
        let missing = dialogs_missing_in(env(bare())).unwrap();
        assert!(missing.contains("Type the path"), "{missing}");
        let mut bus = bare();
        bus.push(("DBUS_SESSION_BUS_ADDRESS", "unix:path=/x".into()));
        assert_eq!(dialogs_missing_in(env(bus)), None);
        std::fs::write(bin.path().join("zenity"), "").unwrap();
        assert_eq!(dialogs_missing_in(env(bare())), None, "zenity on the PATH");
        std::fs::remove_file(bin.path().join("zenity")).unwrap();
        std::fs::write(runtime.path().join("bus"), "").unwrap();
        assert_eq!(
            dialogs_missing_in(env(bare())),
            None,
            "the runtime dir's bus"
        );
    }
}
