//! The window's keyboard shortcuts in one table: what `logic()` listens for and what the
//! shortcuts overlay (F1, or `?` outside text fields) lists, so the two cannot drift apart.

use eframe::egui::{self, Key, KeyboardShortcut, Modifiers};

use super::command::Command;

/// One shortcut: its keys, what it does in words, and the command it pushes.
pub struct Shortcut {
    pub keys: KeyboardShortcut,
    pub what: &'static str,
    pub command: Command,
}

fn shortcut(modifiers: Modifiers, key: Key, what: &'static str, command: Command) -> Shortcut {
    Shortcut {
        keys: KeyboardShortcut::new(modifiers, key),
        what,
        command,
    }
}

/// Every shortcut of the window.
pub fn table() -> [Shortcut; 6] {
    let ctrl = Modifiers::COMMAND;
    [
        shortcut(ctrl, Key::O, "open a preset file", Command::AskOpenPreset),
        shortcut(ctrl, Key::S, "save the preset", Command::Save),
        shortcut(ctrl, Key::Enter, "train the preset", Command::Start),
        shortcut(ctrl, Key::Period, "stop the selected run", Command::Stop),
        shortcut(
            ctrl | Modifiers::SHIFT,
            Key::C,
            "copy the preset as an attnlab train command",
            Command::CopyCliCommand,
        ),
        shortcut(
            Modifiers::NONE,
            Key::F1,
            "show or hide these shortcuts (also ?)",
            Command::ToggleShortcuts,
        ),
    ]
}

/// The commands of the shortcuts pressed since the last frame (consumed, so no widget sees
/// them too). `?` counts only while no text field has the keyboard: there it is typed.
pub fn pressed(ctx: &egui::Context) -> Vec<Command> {
    let mut commands: Vec<Command> = table()
        .into_iter()
        .filter(|s| ctx.input_mut(|i| i.consume_shortcut(&s.keys)))
        .map(|s| s.command)
        .collect();
    let typing = ctx.memory(|m| m.focused().is_some());
    let question = KeyboardShortcut::new(Modifiers::NONE, Key::Questionmark);
    if !typing && ctx.input_mut(|i| i.consume_shortcut(&question)) {
        commands.push(Command::ToggleShortcuts);
    }
    commands
}

/// The overlay listing every shortcut, while `open`.
pub fn overlay_ui(ctx: &egui::Context, open: &mut bool) {
    egui::Window::new("Keyboard shortcuts")
        .open(open)
        .collapsible(false)
        .resizable(false)
        .anchor(egui::Align2::CENTER_CENTER, egui::Vec2::ZERO)
        .show(ctx, |ui| {
            egui::Grid::new("shortcuts").striped(true).show(ui, |ui| {
                for s in table() {
                    ui.strong(ctx.format_shortcut(&s.keys));
                    ui.label(s.what);
                    ui.end_row();
                }
            });
            ui.label(
                egui::RichText::new(
                    "Hover a control of the editor for the preset key it sets (the command \
                     line's --set).",
                )
                .weak(),
            );
        });
}
