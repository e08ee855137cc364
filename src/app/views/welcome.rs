//! The welcome page: the experiments the workbench is for, each one click away, with the
//! paper's claim it checks, the time it takes on the 2-core development machine and where to
//! look when it ends. The catalogue is the library's ([`crate::experiments`]); this page only
//! draws it and pushes [`Command::RunExperiment`].

use eframe::egui;

use super::super::command::Command;
use super::{View, ViewContext};
use crate::experiments::{Analysis, EXPERIMENTS, Experiment};

#[derive(Default)]
pub struct WelcomeView;

impl View for WelcomeView {
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        egui::ScrollArea::vertical().show(ui, |ui| {
            ui.heading("attnlab: attention mechanisms and positional encodings, hands on");
            ui.label(
                "Each experiment below reproduces a claim of a paper at a scale this machine \
                 trains in minutes. Run starts it: its preset goes into the editor (left), its \
                 runs train (the run list), and the view that shows the result opens; the \
                 analysis starts by itself when the runs end.",
            );
            ui.label(
                egui::RichText::new(
                    "Or build your own: edit the preset on the left (hover a control for its \
                     preset key), Preset > Shipped for the others, F1 for the shortcuts.",
                )
                .weak(),
            );
            ui.label(
                egui::RichText::new(
                    "Times were measured on a 2-core machine, most while other work shared it \
                     (load 8-10; idle it trained in about half the time); more cores are \
                     faster.",
                )
                .weak(),
            );
            ui.separator();
            for (i, experiment) in EXPERIMENTS.iter().enumerate() {
                experiment_ui(ui, i, experiment, cx);
            }
        });
    }
}

/// What the experiments' times were measured with.
const MEASURED_WITH: &str = "Measured on the 2-core development machine (an AMD EPYC virtual \
     machine) with the release CLI on 2026-11-23, while other builds shared it (load average \
     8-10; idle, training took about half as long), unless the experiment names another day. The window trains at the lowest CPU \
     priority: another busy program makes it slower (ATTNLAB_TRAINING_PRIORITY=normal keeps \
     normal priority); more cores make it faster.";

/// One experiment: its title as the button, then claim, time and where to look.
fn experiment_ui(ui: &mut egui::Ui, index: usize, experiment: &Experiment, cx: &ViewContext) {
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal_wrapped(|ui| {
            let run = ui
                .button(format!("Run: {}", experiment.title))
                .on_hover_text(presets_text(experiment));
            if run.clicked() {
                cx.commands.push(Command::RunExperiment(index));
            }
            ui.label(egui::RichText::new(format!("({})", experiment.source)).italics());
        });
        let line = |ui: &mut egui::Ui, what: &str, text: &str| {
            ui.horizontal_wrapped(|ui| {
                ui.strong(what);
                ui.label(text)
            })
            .inner
        };
        line(ui, "Claim:", experiment.claim);
        line(ui, "Takes (2 CPU cores):", experiment.expected).on_hover_text(MEASURED_WITH);
        line(ui, "Then look at:", experiment.look_at);
    });
    ui.add_space(6.0);
}

/// The presets an experiment trains, with the settings it changes, or the sweep it runs.
fn presets_text(experiment: &Experiment) -> String {
    if let Analysis::Sweep(name) = experiment.analysis {
        return format!("runs sweeps/{name}.toml in the Sweep view");
    }
    let runs: Vec<String> = experiment
        .runs
        .iter()
        .map(|r| {
            let mut text = format!("presets/{}.toml", r.preset);
            for set in r.set {
                text.push_str(&format!(" --set {set}"));
            }
            text
        })
        .collect();
    format!("trains {}", runs.join(", "))
}
