//! The shell's panels: the menu bar, the editor and run list, the central view, the status
//! bar and the dialogs. Menus and buttons push [`Command`]s; widgets change what they show
//! in place (the tab, the selected or removed run, the answer to "discard unsaved changes?").

use eframe::egui;

use super::{AttnlabApp, Command, Editor, RunView, Tab, keys};

impl AttnlabApp {
    /// The whole window (the same function runs under eframe and under egui_kittest).
    pub fn show(&mut self, ui: &mut egui::Ui) {
        self.logic(&ui.ctx().clone());
        readable_small_text(ui.ctx());
        egui::Panel::top("menu").show(ui, |ui| self.top_bar(ui));
        egui::Panel::bottom("status").show(ui, |ui| {
            ui.horizontal(|ui| {
                if let Some((message, left)) = self.status.shown() {
                    ui.label(message);
                    ui.ctx().request_repaint_after(left);
                }
                for job in self.jobs.live() {
                    ui.separator();
                    ui.weak(job);
                }
            });
        });
        egui::Panel::left("editor")
            .resizable(true)
            .default_size(320.0)
            .show(ui, |ui| {
                egui::ScrollArea::vertical().show(ui, |ui| {
                    self.editor.ui(ui);
                    ui.separator();
                    self.runs_ui(ui);
                });
            });
        egui::CentralPanel::default().show(ui, |ui| {
            // Wrapped: at 1024 px the last tabs were cut off.
            ui.horizontal_wrapped(|ui| {
                for &tab in Tab::ALL {
                    ui.selectable_value(&mut self.tab, tab, tab.label());
                }
            });
            ui.separator();
            let ctx = ui.ctx().clone();
            let tab = self.tab;
            let (views, cx) = self.split(&ctx);
            views.view_mut(tab).ui(ui, &cx);
        });
        self.confirm_ui(ui.ctx());
        self.prompt_ui(ui.ctx());
        keys::overlay_ui(ui.ctx(), &mut self.show_shortcuts);
    }

    pub(super) fn top_bar(&mut self, ui: &mut egui::Ui) {
        let commands = self.commands.clone();
        let push = |response: egui::Response, command: Command| {
            if response.clicked() {
                commands.push(command);
            }
        };
        ui.horizontal(|ui| {
            ui.menu_button("Preset", |ui| {
                push(ui.button("New"), Command::NewPreset);
                push(ui.button("Open... (Ctrl+O)"), Command::AskOpenPreset);
                push(ui.button("Save (Ctrl+S)"), Command::Save);
                push(ui.button("Save as..."), Command::AskSavePreset);
                let copy = ui
                    .button("Copy as CLI command")
                    .on_hover_text("an attnlab train line with a --set per change (Ctrl+Shift+C)");
                push(copy, Command::CopyCliCommand);
                ui.separator();
                ui.label("Shipped");
                for shipped in crate::experiments::PRESETS {
                    let button = ui.button(shipped.name).on_hover_text(shipped.file);
                    push(button, Command::OpenShipped(shipped.name));
                }
                if !self.recent.is_empty() {
                    ui.separator();
                    ui.label("Recent");
                    for path in &self.recent {
                        let button = ui.button(path.display().to_string());
                        push(button, Command::OpenPreset(path.clone()));
                    }
                }
            });
            ui.menu_button("Help", |ui| {
                push(ui.button("Welcome page"), Command::Show(Tab::Welcome));
                push(
                    ui.button("Keyboard shortcuts (F1)"),
                    Command::ToggleShortcuts,
                );
            });
            push(ui.button("Open run..."), Command::AskOpenRun);
            let model = ui
                .button("Open model...")
                .on_hover_text("a pretrained model's Hugging Face folder: GPT-2, Pythia, GPT-Neo");
            push(model, Command::AskOpenModel);
            ui.separator();
            let problem = self.editor.problem().map(str::to_string);
            let start = ui
                .add_enabled(problem.is_none(), egui::Button::new("Start"))
                .on_hover_text("train the preset (Ctrl+Enter)")
                .on_disabled_hover_text(problem.unwrap_or_default());
            push(start, Command::Start);
            if let Some(memory) = self.editor.memory() {
                let total = crate::preset::bytes(memory.total());
                let state = match self.editor.preset.state() {
                    Some(state) => format!(
                        "{} floats ({} in zoology's units)",
                        state.floats, state.zoology_units
                    ),
                    None => format!("n/a ({})", self.editor.preset.why_no_state()),
                };
                ui.weak(format!("≈ {total}")).on_hover_text(format!(
                    "memory a run of this preset needs: {memory}\nrecurrent state at the \
                     task's length: {state}"
                ));
            }
            let running = self.runs.selected().is_some_and(RunView::is_running);
            let stop = ui
                .add_enabled(running, egui::Button::new("Stop"))
                .on_hover_text("Ctrl+.");
            push(stop, Command::Stop);
            if let Some(run) = self.runs.selected() {
                progress_ui(ui, run);
            }
            let title = match (&self.editor.path, self.editor.is_dirty()) {
                (Some(path), dirty) => {
                    format!("{}{}", path.display(), if dirty { " *" } else { "" })
                }
                (None, _) => "unsaved preset".into(),
            };
            ui.label(egui::RichText::new(title).weak());
        });
    }

    pub(super) fn runs_ui(&mut self, ui: &mut egui::Ui) {
        ui.strong("Runs");
        if self.runs.runs.is_empty() {
            ui.label("none yet: press Start, or open a run folder");
        }
        let mut clicked = None;
        let mut removed = None;
        let selected = self.runs.selected;
        let commands = self.commands.clone();
        for (i, run) in self.runs.runs.iter_mut().enumerate() {
            if let Some((id, name, focused)) = &mut self.renaming
                && *id == run.id
            {
                if let Some(done) = rename_ui(ui, name, focused) {
                    if done {
                        commands.push(Command::RenameRun(*id, name.trim().to_string()));
                    }
                    self.renaming = None;
                }
                continue;
            }
            ui.horizontal(|ui| {
                ui.add(egui::Checkbox::without_text(&mut run.compare))
                    .on_hover_text("compare: draw this run's curves beside the selected run's");
                let remove = ui
                    .add_enabled(!run.is_running(), egui::Button::new("x").small())
                    .on_hover_text("remove from the list (the run folder stays)");
                if remove.clicked() {
                    removed = Some(i);
                }
                // A failure's reason can be long: the entry is cut at the panel's edge and
                // the whole of it, with the folder, is on hover.
                let text = format!("{} ({})", run.name, run.status_text());
                let button = egui::Button::selectable(selected == Some(i), text.as_str());
                let response = ui.add(button.truncate());
                let mut hover = match &run.dir {
                    Some(dir) => format!("{text}\n{}", dir.display()),
                    None => text,
                };
                if let Some(owner) = run.trained_by() {
                    hover.push_str(&format!("\ntrained by {owner}: stop it there"));
                }
                let response = response.on_hover_text(hover);
                if response.clicked() {
                    clicked = Some(i);
                }
                response.context_menu(|ui| {
                    let refusal = run.rename_refusal();
                    let rename = ui
                        .add_enabled(refusal.is_none(), egui::Button::new("Rename..."))
                        .on_hover_text(
                            "name the run anew in its preset and summary (the folder keeps \
                             its name)",
                        )
                        .on_disabled_hover_text(refusal.unwrap_or_default());
                    if rename.clicked() {
                        self.renaming = Some((run.id, run.name.clone(), false));
                        ui.close();
                    }
                });
            });
        }
        if let Some(i) = clicked {
            self.runs.selected = Some(i);
        }
        if let Some(i) = removed {
            self.runs.remove(i);
        }
        if let Some(run) = self.runs.selected() {
            if let Some(notice) = &run.notice {
                ui.colored_label(ui.visuals().warn_fg_color, notice);
            }
            if let Some(corpus) = &run.corpus {
                ui.label(format!("text: {corpus}"))
                    .on_hover_text("what this language model trained on (task.corpus)");
            }
            if let Some(error) = &run.error {
                ui.colored_label(ui.visuals().error_fg_color, error);
            }
        }
    }

    /// The window asking for a path where no file dialog opens.
    fn prompt_ui(&mut self, ctx: &egui::Context) {
        let Some(prompt) = &mut self.prompt else {
            return;
        };
        if let Some(answer) = prompt.ui(ctx) {
            self.prompt = None;
            if let Some(command) = answer {
                self.commands.push(command);
            }
        }
    }

    pub(super) fn confirm_ui(&mut self, ctx: &egui::Context) {
        let Some((_, path)) = &self.confirm_replace else {
            return;
        };
        let target = path
            .as_ref()
            .map_or("a new preset".into(), |p| p.display().to_string());
        let mut answer = None;
        egui::Window::new("Unsaved changes")
            .collapsible(false)
            .resizable(false)
            .show(ctx, |ui| {
                ui.label(format!(
                    "The preset has unsaved changes. Discard them and open {target}?"
                ));
                ui.horizontal(|ui| {
                    if ui.button("Discard").clicked() {
                        answer = Some(true);
                    }
                    if ui.button("Cancel").clicked() {
                        answer = Some(false);
                    }
                });
            });
        if let Some(discard) = answer
            && let Some((preset, path)) = self.confirm_replace.take()
            && discard
        {
            if let Some(path) = &path {
                self.remember(path.clone());
            }
            self.editor = Editor::new(preset, path);
        }
    }
}

/// The state, steps, ETA and throughput of a run: a live run's percentage and ETA, an ended
/// one's state and where it ended (a run that reached its target ends early, so "12%" alone
/// would read as unfinished).
fn progress_ui(ui: &mut egui::Ui, run: &RunView) {
    let progress = run.progress();
    let mut text = run.status_text();
    let mut hover = priority_text();
    if let Some(last) = run.steps.last() {
        if run.is_running() {
            text.push_str(&format!(" {:.0}%", 100.0 * progress));
            let target = run.preset.train.target_accuracy;
            if progress > 0.0 {
                let eta = last.elapsed_secs * (1.0 / f64::from(progress) - 1.0);
                // To the step limit: a run with a target stops when it reaches it.
                let bound = if target > 0.0 { "≤ " } else { "" };
                text.push_str(&format!(", eta {bound}{eta:.0} s"));
            }
            if target > 0.0 {
                hover = format!(
                    "The ETA counts to the last step; the run stops earlier once its test \
                     accuracy (train.metric) reaches {:.0}%.\n{hover}",
                    100.0 * target
                );
            }
        } else if let Some(at) = run.ended_at() {
            text.push(' ');
            text.push_str(&at);
        }
        text.push_str(&format!(", {:.0} tokens/s", last.tokens_per_s));
    }
    ui.add(
        egui::ProgressBar::new(progress)
            .desired_width(280.0)
            .text(text),
    )
    .on_hover_text(hover);
}

/// At which CPU priority the window trains, and how to change it.
fn priority_text() -> String {
    let variable = crate::train::PRIORITY_VARIABLE;
    match crate::train::background_priority_is_low() {
        Ok(false) => format!("Training runs at normal CPU priority ({variable}=normal)."),
        _ if !cfg!(target_os = "linux") => "Training runs at normal CPU priority.".into(),
        _ => format!(
            "Training runs at the lowest CPU priority (nice 19), so the window keeps drawing; \
             another busy program on this machine comes first and slows it. Start attnlab with \
             {variable}=normal to train at normal priority."
        ),
    }
}

/// The run list's entry while a run is renamed: the name being typed (focused when it
/// opens), Rename and Cancel. Returns `Some(true)` to rename (Rename, or Enter), `Some(false)`
/// to cancel (Cancel, Esc).
fn rename_ui(ui: &mut egui::Ui, name: &mut String, focused: &mut bool) -> Option<bool> {
    ui.horizontal(|ui| {
        let label = ui.label("new name");
        let field = ui.text_edit_singleline(name).labelled_by(label.id);
        if !*focused {
            field.request_focus();
            *focused = true;
        }
        let entered = field.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
        let escaped = ui.input(|i| i.key_pressed(egui::Key::Escape));
        if ui.button("Rename").clicked() || entered {
            Some(true)
        } else if ui.button("Cancel").clicked() || escaped {
            Some(false)
        } else {
            None
        }
    })
    .inner
}

/// The smallest text the window draws (captions, hints, compact legends), in points: egui's
/// small text is 9, which read as 8 px grey smudges beside 13-point body text.
pub const SMALL_TEXT: f32 = 11.0;

/// Raises egui's small text to [`SMALL_TEXT`] (once: later frames find it set).
fn readable_small_text(ctx: &egui::Context) {
    let small = ctx.global_style().text_styles[&egui::TextStyle::Small].size;
    if small < SMALL_TEXT {
        ctx.all_styles_mut(|style| {
            if let Some(font) = style.text_styles.get_mut(&egui::TextStyle::Small) {
                font.size = SMALL_TEXT;
            }
        });
    }
}
