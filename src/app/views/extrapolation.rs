//! Length extrapolation (issue 5): perplexity against evaluation length for language-modelling
//! runs, in either protocol, with the Definition 0.1 and Theorem 0.4 verdicts side by side; and a
//! button that trains a chosen set of encodings and evaluates them in one go. The plot and its
//! export are the figure of the [`ExtrapolationReport`] that `attnlab extrapolate` prints.

use std::collections::BTreeSet;
use std::path::PathBuf;

use eframe::egui;

use super::super::command::Command;
use super::super::export::Exporter;
use super::super::jobs::{Job, Jobs, take_result};
use super::super::plot::{PlotOptions, show_figure};
use super::{RunList, View, ViewContext, left_out_line, run_buttons};
use crate::Preset;
use crate::experiments::{PRESETS, shipped};
use crate::extrapolation::pretrained::extrapolate_folder;
use crate::extrapolation::{
    Extrapolation, Options, Protocol, extrapolate_runs, train_and_extrapolate,
};
use crate::report::extrapolation::ExtrapolationReport;
use crate::train::{RunDir, TrainEvent};

/// What a job of this view hands back.
struct Done {
    sweep: Extrapolation,
    /// Run folders that are new to the list (trained by the job).
    new_runs: Vec<PathBuf>,
    /// Runs of the list the table cannot hold, with why.
    left_out: Vec<String>,
}

impl Done {
    /// The table, with the runs it left out (failed, or not reached before a cancel).
    fn of(sweep: Extrapolation) -> Self {
        Self {
            left_out: sweep.left_out.clone(),
            sweep,
            new_runs: Vec::new(),
        }
    }
}

#[derive(Default)]
pub struct ExtrapolationView {
    pub options: Options,
    /// Evaluation lengths as typed (comma-separated); empty for L, 2L, …, 64L.
    pub lengths: String,
    log_ppl: bool,
    /// Shipped language-modelling presets (names) ticked for "train and evaluate".
    pub ticked: BTreeSet<&'static str>,
    /// A pretrained model's Hugging Face folder, and the text file it is scored on.
    pub model_folder: String,
    pub corpus: String,
    dialog: Option<Job<Option<Picked>>>,
    job: Option<Job<Done>>,
    pub report: Option<ExtrapolationReport>,
    pub error: Option<String>,
    /// The runs the last evaluation left out, and why.
    pub left_out: Option<String>,
}

/// What a file dialog of this view picked.
enum Picked {
    ModelFolder(PathBuf),
    Corpus(PathBuf),
}

/// `Ok(None)` for a cancelled computation (the library reports it as [`crate::Error::Cancelled`]).
fn unless_cancelled<T>(result: crate::Result<T>) -> crate::Result<Option<T>> {
    match result {
        Err(crate::Error::Cancelled) => Ok(None),
        other => other.map(Some),
    }
}

impl View for ExtrapolationView {
    /// A computation (or a train-and-evaluate job) under way.
    fn is_busy(&self) -> bool {
        self.job.is_some()
    }

    fn analyse(&mut self, jobs: &Jobs, runs: RunList) {
        self.evaluate(jobs, runs);
    }

    fn logic(&mut self, cx: &ViewContext) {
        match take_result(&mut self.dialog, &mut self.error, None) {
            Some(Some(Picked::ModelFolder(dir))) => self.model_folder = dir.display().to_string(),
            Some(Some(Picked::Corpus(file))) => self.corpus = file.display().to_string(),
            _ => {}
        }
        let cancelled = Some("extrapolation cancelled");
        if let Some(done) = take_result(&mut self.job, &mut self.error, cancelled) {
            for dir in done.new_runs {
                cx.commands.push(Command::OpenRun(dir));
            }
            self.left_out = left_out_line(&done.left_out);
            self.report = Some(ExtrapolationReport {
                sweep: done.sweep,
                log_ppl: self.log_ppl,
            });
        }
    }

    /// The shipped `lm_*` presets are offered for "train and evaluate".
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let exporter = cx.exporter;
        self.options_ui(ui);
        if let Some(report) = &mut self.report {
            report.log_ppl = self.log_ppl;
        }
        match &self.job {
            Some(job) => job.ui(ui),
            None => self.start_ui(ui, cx),
        }
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        if let Some(left_out) = &self.left_out {
            ui.colored_label(ui.visuals().warn_fg_color, left_out);
        }
        ui.separator();
        let Some(report) = &self.report else {
            ui.label(
                "No results yet: evaluate language-modelling runs, or tick encodings and press \
                 Train and evaluate.",
            );
            return;
        };
        egui::ScrollArea::vertical().show(ui, |ui| {
            curves_ui(ui, report, exporter);
            ui.separator();
            table_ui(ui, &report.sweep);
        });
    }
}

impl ExtrapolationView {
    fn options_ui(&mut self, ui: &mut egui::Ui) {
        let o = &mut self.options;
        ui.horizontal_wrapped(|ui| {
            let label = ui.label("protocol");
            egui::ComboBox::from_id_salt("protocol")
                .selected_text(o.protocol.name())
                .show_ui(ui, |ui| {
                    for protocol in [Protocol::NonOverlapping, Protocol::Sliding] {
                        ui.selectable_value(&mut o.protocol, protocol, protocol.name());
                    }
                })
                .response
                .labelled_by(label.id);
            if o.protocol == Protocol::Sliding {
                let mut fixed = o.stride.is_some();
                if ui
                    .checkbox(&mut fixed, "stride")
                    .on_hover_text("off: n/2")
                    .changed()
                {
                    o.stride = fixed.then_some(32);
                }
                if let Some(stride) = &mut o.stride {
                    ui.add(egui::DragValue::new(stride).range(1..=65_536));
                }
            }
            let label = ui.label("lengths");
            ui.add(
                egui::TextEdit::singleline(&mut self.lengths)
                    .hint_text("L, 2L, …, 64L")
                    .desired_width(160.0),
            )
            .labelled_by(label.id);
            let label = ui.label("δ");
            ui.add(
                egui::DragValue::new(&mut o.delta)
                    .range(0.001..=10.0)
                    .speed(0.01),
            )
            .labelled_by(label.id);
            ui.checkbox(&mut o.rotary_variants, "RoPE: PI, NTK, ReRoPE at inference");
            ui.checkbox(&mut self.log_ppl, "log perplexity");
        });
        ui.horizontal(|ui| {
            let label = ui.label("tokens scored");
            ui.add(egui::DragValue::new(&mut o.max_tokens).range(1024..=16_777_216))
                .labelled_by(label.id);
            let label = ui.label("queries per block");
            ui.add(egui::DragValue::new(&mut o.chunk).range(1..=65_536))
                .labelled_by(label.id)
                .on_hover_text("softmax attention is evaluated in blocks of this many queries");
        });
        ui.label(
            egui::RichText::new(o.protocol.describe(o.stride))
                .small()
                .weak(),
        );
    }

    /// The options with the typed lengths, or what is wrong with them.
    fn parsed_options(&self) -> Result<Options, String> {
        let mut options = self.options.clone();
        options.lengths = self
            .lengths
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| format!("length '{t}' is not a positive whole number"))
            })
            .collect::<Result<_, _>>()?;
        Ok(options)
    }

    /// Evaluates the finished runs `list` (name, folder) at the view's lengths, as a job.
    fn evaluate(&mut self, jobs: &Jobs, list: RunList) {
        let options = match self.parsed_options() {
            Ok(options) => options,
            Err(message) => {
                self.error = Some(message);
                return;
            }
        };
        // An earlier error would read as this computation's until it ends.
        self.error = None;
        self.job = Some(jobs.spawn("extrapolation", move |progress, cancel| {
            let (dirs, left_out) = one_table_of(&list)?;
            let sweep = extrapolate_runs(&dirs, &options, progress, cancel);
            Ok(unless_cancelled(sweep)?.map(|sweep| {
                let mut done = Done::of(sweep);
                done.left_out.splice(0..0, left_out);
                done
            }))
        }));
    }

    fn start_ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let options = match self.parsed_options() {
            Ok(options) => options,
            Err(message) => {
                ui.colored_label(ui.visuals().error_fg_color, message);
                return;
            }
        };
        ui.horizontal(|ui| {
            let refusal = |p: &crate::Preset| {
                let lm = p.task.lm().is_some();
                (!lm).then(|| crate::extrapolation::NOT_A_LANGUAGE_MODEL.to_string())
            };
            if let Some(list) = run_buttons(ui, cx.runs, refusal) {
                self.evaluate(cx.jobs, list);
            }
        });
        ui.horizontal_wrapped(|ui| {
            ui.label("train and evaluate:");
            for shipped in PRESETS.iter().filter(|s| s.name.starts_with("lm_")) {
                let mut on = self.ticked.contains(shipped.name);
                let name = shipped.name.trim_start_matches("lm_");
                if ui.checkbox(&mut on, name).changed() {
                    if on {
                        self.ticked.insert(shipped.name);
                    } else {
                        self.ticked.remove(shipped.name);
                    }
                }
            }
            let button = ui
                .add_enabled(
                    !self.ticked.is_empty(),
                    egui::Button::new("Train and evaluate"),
                )
                .on_hover_text("trains each ticked preset, then evaluates them all (one job)");
            if button.clicked() {
                self.train_and_evaluate(cx, options.clone());
            }
        });
        self.pretrained_ui(ui, cx.jobs, options);
    }

    /// A pretrained model's folder and a text file of the user's, and the button that scores
    /// it (lengths L/4 … 4L of its positions unless typed; Pythia's rotary scalings with it).
    fn pretrained_ui(&mut self, ui: &mut egui::Ui, jobs: &Jobs, options: Options) {
        ui.horizontal_wrapped(|ui| {
            ui.label("pretrained model:");
            let idle = self.dialog.is_none();
            for (value, hint, picked) in [
                (&mut self.model_folder, "Hugging Face folder", true),
                (&mut self.corpus, "your text file", false),
            ] {
                ui.add(
                    egui::TextEdit::singleline(value)
                        .hint_text(hint)
                        .desired_width(220.0),
                );
                if ui
                    .add_enabled(idle, egui::Button::new("...").small())
                    .clicked()
                {
                    let pick = move || match picked {
                        true => rfd::FileDialog::new()
                            .pick_folder()
                            .map(Picked::ModelFolder),
                        false => rfd::FileDialog::new().pick_file().map(Picked::Corpus),
                    };
                    self.dialog = Some(jobs.spawn("file dialog", move |_, _| {
                        crate::app::prompt::pick_for_field(pick).map(Some)
                    }));
                }
            }
            let ready = !self.model_folder.trim().is_empty() && !self.corpus.trim().is_empty();
            let button = ui
                .add_enabled(ready, egui::Button::new("Evaluate model"))
                .on_hover_text(
                    "perplexity on your text at L/4 … 4L of the model's positions (or the typed \
                     lengths), with PI, NTK and ReRoPE for a rotary model (Pythia); attnlab \
                     cannot download WikiText, so the numbers are your text's",
                )
                .on_disabled_hover_text("give a model folder and a text file");
            if button.clicked() {
                let folder = PathBuf::from(self.model_folder.trim());
                let corpus = PathBuf::from(self.corpus.trim());
                self.error = None;
                self.job = Some(jobs.spawn("extrapolation", move |progress, cancel| {
                    let sweep = extrapolate_folder(&folder, &corpus, &options, progress, cancel);
                    Ok(unless_cancelled(sweep)?.map(Done::of))
                }));
            }
        });
    }

    /// Trains the ticked shipped presets, then evaluates them, as one job.
    fn train_and_evaluate(&mut self, cx: &ViewContext, options: Options) {
        let presets: crate::Result<Vec<Preset>> = self
            .ticked
            .iter()
            .map(|name| shipped(name)?.preset(&[]))
            .collect();
        let presets = match presets {
            Ok(presets) => presets,
            Err(e) => {
                self.error = Some(e.to_string());
                return;
            }
        };
        let root = cx.runs_root.to_path_buf();
        let mut runs = cx.runs.feed().forwarder("train and evaluate");
        self.job = Some(
            cx.jobs
                .spawn("train and evaluate", move |progress, cancel| {
                    let events = &mut |i: usize, event: &TrainEvent| {
                        runs.forward(i, event, || presets[i].clone());
                    };
                    let done =
                        train_and_extrapolate(&presets, &root, &options, progress, events, cancel);
                    Ok(unless_cancelled(done)?.map(|(dirs, sweep)| Done {
                        new_runs: dirs.iter().map(|d| d.path().to_path_buf()).collect(),
                        ..Done::of(sweep)
                    }))
                }),
        );
    }
}

/// The runs of `list` (name, folder) one perplexity table can hold: language models trained
/// at the first one's length; the others named with why ("Compute for every run" had stopped
/// at an MQAR run and lost the perplexities already computed). An error when none is left.
fn one_table_of(list: &RunList) -> crate::Result<(Vec<RunDir>, Vec<String>)> {
    let (mut kept, mut left_out) = (Vec::new(), Vec::new());
    let mut length = None;
    for (name, dir) in list {
        let opened = RunDir::open(dir).and_then(|run| Ok((run.read_preset()?, run)));
        let (preset, run) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                left_out.push(format!("{name} ({e})"));
                continue;
            }
        };
        let len = preset.task.seq_len();
        let why = match (preset.task.lm(), length) {
            (None, _) => format!(
                "{name} (a {} run, not a language model)",
                preset.task.name()
            ),
            (Some(_), Some(first)) if first != len => {
                format!("{name} (trained at L = {len}, the table's runs at {first})")
            }
            (Some(_), _) => {
                length = Some(len);
                kept.push(run);
                continue;
            }
        };
        left_out.push(why);
    }
    match kept.is_empty() {
        true => Err(crate::Error::argument(
            "runs",
            left_out.join("; "),
            "hold no language model: perplexity against length needs one",
        )),
        false => Ok((kept, left_out)),
    }
}

/// Perplexity against length, one line per curve (dashed: encoding changed at inference), on a
/// log length axis: the report's figure, drawn as its export draws it.
fn curves_ui(ui: &mut egui::Ui, report: &ExtrapolationReport, exporter: &Exporter) {
    let sweep = &report.sweep;
    let figure = report.figure();
    let title = format!(
        "validation perplexity vs length ({} protocol, trained at L = {})",
        sweep.protocol.name(),
        sweep.train_length
    );
    exporter.titled(ui, title, "perplexity-vs-length", || figure.clone());
    ui.label(
        egui::RichText::new(&sweep.protocol_description)
            .small()
            .weak(),
    );
    let options = PlotOptions {
        id: Some("perplexity"),
        height: 300.0,
        ..PlotOptions::default()
    };
    show_figure(ui, &figure, &options);
}

/// The perplexity table with Definition 0.1's largest δ and both verdicts; hover a value for
/// its time and memory.
fn table_ui(ui: &mut egui::Ui, sweep: &Extrapolation) {
    egui::Grid::new("perplexity-table")
        .striped(true)
        .show(ui, |ui| {
            ui.strong(format!("perplexity ({})", sweep.protocol.name()));
            for &n in &sweep.lengths {
                ui.strong(if n == sweep.train_length {
                    format!("{n} (L)")
                } else {
                    n.to_string()
                });
            }
            ui.strong("max δ").on_hover_text(
                "the largest δ_n = |ppl_n − ppl_L| / ppl_L over the lengths n beyond the \
                 training length L: how far perplexity strays from its value at L",
            );
            ui.strong(format!("Def. 0.1 (δ = {})", sweep.delta_threshold))
                .on_hover_text(format!(
                    "Definition 0.1 of the RPE paper, checked on this table: the model \
                     extrapolates when every δ_n beyond L is below {} (yes / no)",
                    sweep.delta_threshold
                ));
            ui.strong("Thm 0.4").on_hover_text(
                "Theorem 0.4 of the RPE paper: if Σ_t exp(bias(t)) of the relative encoding \
                 converges, the transformer is guaranteed to extrapolate (a sufficient \
                 condition). The series' verdict for this run's encoding, its learned values \
                 where it has them; not-applicable for absolute and rotary encodings. Hover a \
                 verdict for its evidence",
            );
            ui.end_row();
            for curve in &sweep.curves {
                ui.label(&curve.name);
                for point in &curve.points {
                    let text = point.ppl.map_or("n/a".to_string(), |p| format!("{p:.3}"));
                    let memory = point.peak_bytes.map_or(String::new(), |b| {
                        format!(", peak {:.0} MiB", b as f64 / 1048576.0)
                    });
                    let hover = format!(
                        "{} tokens in {:.1} s{memory}{}",
                        point.tokens,
                        point.secs,
                        point
                            .note
                            .as_deref()
                            .map_or(String::new(), |n| format!("\n{n}"))
                    );
                    ui.label(text).on_hover_text(hover);
                }
                let max = curve
                    .delta
                    .iter()
                    .flatten()
                    .copied()
                    .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
                ui.label(max.map_or("n/a".into(), |d| format!("{d:.3}")));
                ui.label(match curve.extrapolates {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "n/a",
                });
                ui.label(&curve.theorem)
                    .on_hover_text(&curve.theorem_evidence);
                ui.end_row();
            }
        });
}
