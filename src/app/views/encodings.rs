//! The encoding analyses, live: exp(bias) by distance, TRF curves, the convergence verdict and
//! the exp(bias) heatmap for the editor's encoding and any others ticked, recomputed on a
//! job whenever a setting changes; the selected run's ERF on the TRF axes.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use eframe::egui;

use super::super::export::Exporter;
use super::super::jobs::{Job, take_result};
use super::super::plot::{PlotOptions, show_figure};
use super::colour::{ColourScale, axes_note};
use super::{View, ViewContext, empty_plot};
use crate::analysis::figures::encodings as fig;
use crate::analysis::{ErfProtocol, Heads, Rows, StudiedEncoding};
use crate::encodings::EncodingSpec;
use crate::experiments::Experiment;
use crate::figures::{Figure, Plot, QUERY_KEY_AXES};
use crate::report::Report;
use crate::report::encodings::{BiasReport, ErfReport, TrfReport, TrfSettings};
use crate::train::RunDir;

/// Points of the TRF curves.
const POINTS: usize = 50;
/// Largest heatmap side drawn (the figure renderer downsamples beyond 256 anyway).
const HEATMAP: usize = 256;
/// Distances shown in the exp(bias) curves.
const CURVE: usize = 4096;
/// The lowest the plots get in a short window (the view scrolls below them).
const MIN_PLOT_HEIGHT: f32 = 220.0;

/// Everything the view draws, for one set of inputs: the reports `attnlab bias`, `trf` and
/// `erf` print, computed by the same code.
pub struct Results {
    pub length: usize,
    /// exp(bias) by distance and Theorem 0.4's verdict of each encoding.
    pub bias: BiasReport,
    /// The TRF curves and the rotary decay bounds.
    pub trf: TrfReport,
    /// exp(bias) of the editor's encoding, n×n, NaN above the diagonal.
    pub heatmap: Option<(String, usize, Vec<f64>)>,
    /// The selected run's ERF beside its encoding's TRF, or why there is none.
    pub run: Option<Result<ErfReport, String>>,
    /// The figures the view draws, built with the results (not once a frame).
    figures: Figures,
}

/// The view's figures, from its reports.
struct Figures {
    /// The TRF curves with the run's ERF overlaid, and whether it has any curve.
    trf: (Figure, bool),
    /// exp(bias) by distance, and whether an encoding shown has a relative bias.
    exp_bias: (Figure, bool),
    /// The rotary decay bounds; `None` without a rotary encoding.
    decay: Option<Figure>,
}

impl Figures {
    /// The figures of `bias`, `trf` and the run's ERF report, as `attnlab bias`, `trf` and
    /// `erf` draw them; the run's curves go on the TRF's axes.
    fn of(bias: &BiasReport, trf: &TrfReport, run: Option<&ErfReport>) -> Self {
        let mut trf_figures = trf.figures();
        let decay = trf_figures
            .iter()
            .position(|(suffix, _)| suffix == "decay")
            .map(|i| trf_figures.remove(i).1);
        let run = run.and_then(|report| report.figures().into_iter().next());
        let drawn = !trf.trf.is_empty() || run.is_some();
        let mut main = trf_figures.into_iter().next().map_or_else(
            || fig::receptive_field("", 0, Vec::new(), ""),
            |(_, figure)| figure,
        );
        if let (Plot::Lines(lines), Some((_, run))) = (&mut main.plot, run)
            && let Plot::Lines(erf) = run.plot
        {
            lines.series.extend(erf.series);
        }
        let has_bias = bias.entries().any(|(_, e)| e.bias.is_some());
        let exp_bias = bias.figures().into_iter().next().map_or_else(
            || fig::exp_bias(0, Vec::new(), ""),
            |(_, figure)| figure,
        );
        Self {
            trf: (main, drawn),
            exp_bias: (exp_bias, has_bias),
            decay,
        }
    }
}

/// The inputs of a computation; a change starts a new one.
#[derive(Clone, PartialEq)]
struct Inputs {
    specs: Vec<EncodingSpec>,
    n_heads: usize,
    qk_dim: usize,
    length: usize,
    /// The selected run's folder and the version of its saved attention.
    run: Option<(PathBuf, u64)>,
}

pub struct EncodingsView {
    /// Other encodings overlaid on the editor's.
    pub ticked: BTreeSet<String>,
    pub length: usize,
    inputs: Option<Inputs>,
    pending: Option<Job<Results>>,
    pub results: Option<Results>,
    pub error: Option<String>,
    /// The heatmap of `results`, uploaded once per result.
    heatmap_texture: Option<(egui::TextureHandle, ColourScale)>,
}

impl Default for EncodingsView {
    fn default() -> Self {
        Self {
            ticked: BTreeSet::new(),
            length: 512,
            inputs: None,
            pending: None,
            results: None,
            error: None,
            heatmap_texture: None,
        }
    }
}

/// The analyses for `inputs` (runs on a background thread); `None` once `cancel` is set (the
/// inputs changed again: a dragged slider starts a study per frame).
fn compute(inputs: &Inputs, cancel: &AtomicBool) -> crate::Result<Option<Results>> {
    let m = inputs.length;
    let cancelled = || cancel.load(Ordering::Relaxed);
    let mut studied = Vec::new();
    for spec in &inputs.specs {
        if cancelled() {
            return Ok(None);
        }
        studied.push(StudiedEncoding::untrained(
            spec,
            inputs.n_heads,
            inputs.qk_dim,
        )?);
    }
    let bias = BiasReport::new(&studied, m.min(CURVE), Heads::Mean)?;
    if cancelled() {
        return Ok(None);
    }
    let settings = TrfSettings {
        length: m,
        points: POINTS,
        eps: Vec::new(),
        heads: Heads::Mean,
        shape: format!("{} heads of width {}", inputs.n_heads, inputs.qk_dim),
    };
    let trf = TrfReport::new(&studied, &settings)?;
    let heatmap = match studied.first() {
        Some(first) => {
            let n = m.min(HEATMAP);
            first
                .exp_bias_matrix(n, Heads::Mean)?
                .map(|values| (first.label.clone(), n, values))
        }
        None => None,
    };
    if cancelled() {
        return Ok(None);
    }
    let run = inputs.run.as_ref().map(|(dir, _)| {
        let protocol = ErfProtocol {
            layer: None,
            heads: Heads::Mean,
            rows: Rows::All,
        };
        RunDir::open(dir)
            .and_then(|run| ErfReport::new(&run, protocol, POINTS))
            .map_err(|e| e.to_string())
    });
    let figures = Figures::of(&bias, &trf, run.as_ref().and_then(|r| r.as_ref().ok()));
    Ok(Some(Results {
        length: m,
        bias,
        trf,
        heatmap,
        run,
        figures,
    }))
}

impl EncodingsView {
    /// Starts a new computation when the inputs changed (a running one is dropped, so cancelled).
    fn restart_if_changed(&mut self, cx: &ViewContext) {
        let preset = &cx.editor.preset;
        let editor_spec = &preset.encoding;
        let mut specs = vec![editor_spec.clone()];
        specs.extend(
            EncodingSpec::all_defaults()
                .into_iter()
                .filter(|s| self.ticked.contains(s.name()) && s.name() != editor_spec.name()),
        );
        let run = cx.runs.selected();
        let run_key = run.and_then(|r| {
            Some((r.dir.clone()?, r.attention_version)).filter(|_| r.attention.is_some())
        });
        let inputs = Inputs {
            specs,
            n_heads: preset.model.n_heads.max(1),
            qk_dim: preset.attention.qk_dim(preset.model.head_dim()).max(2),
            length: self.length,
            run: run_key,
        };
        if self.inputs.as_ref() == Some(&inputs) {
            return;
        }
        let job = inputs.clone();
        let study = move |_: &mut dyn FnMut(f32), cancel: &AtomicBool| compute(&job, cancel);
        self.pending = Some(cx.jobs.spawn_replacing("encoding study", study));
        self.inputs = Some(inputs);
    }
}

impl View for EncodingsView {
    /// The encodings the experiment compares, ticked beside the editor's.
    fn take_experiment(&mut self, experiment: &Experiment) {
        let overlay = experiment.overlay.iter().map(|e| e.to_string());
        self.ticked.extend(overlay);
    }

    /// Something to compare: the paper's series and RoPE's decay.
    fn prepare_demo(&mut self) -> bool {
        if self.ticked.is_empty() {
            let names = ["alibi", "type1", "type2", "inv-n", "rope"];
            self.ticked.extend(names.map(String::from));
        }
        true
    }

    fn logic(&mut self, _cx: &ViewContext) {
        if let Some(results) = take_result(&mut self.pending, &mut self.error, None) {
            self.results = Some(results);
            self.heatmap_texture = None;
        }
    }

    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let exporter = cx.exporter;
        self.restart_if_changed(cx);
        ui.horizontal_wrapped(|ui| {
            ui.label("overlay:");
            for spec in EncodingSpec::all_defaults() {
                let name = spec.name();
                let mut on = self.ticked.contains(name);
                if ui
                    .checkbox(&mut on, name)
                    .on_hover_text(spec.formula())
                    .changed()
                {
                    if on {
                        self.ticked.insert(name.to_string());
                    } else {
                        self.ticked.remove(name);
                    }
                }
            }
        });
        ui.horizontal(|ui| {
            let label = ui.label("length m");
            ui.add(egui::Slider::new(&mut self.length, 8..=1_000_000).logarithmic(true))
                .labelled_by(label.id);
            if self.pending.is_some() {
                ui.spinner();
            }
        });
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        let Some(results) = &self.results else {
            return;
        };
        let texture = &mut self.heatmap_texture;
        // Scrolled below a plot height that reads: at 1024x700 the plots fitted into the
        // window were 90 px tall.
        egui::ScrollArea::vertical().show(ui, |ui| {
            Self::verdicts_ui(ui, results);
            let height = (ui.available_height() / 2.0 - 30.0).max(MIN_PLOT_HEIGHT);
            ui.columns(2, |columns| {
                trf_plot(&mut columns[0], results, height, exporter);
                exp_bias_plot(&mut columns[1], results, height, exporter);
            });
            ui.columns(2, |columns| {
                decay_plot(&mut columns[0], results, height, exporter);
                heatmap_ui(&mut columns[1], results, texture, height, exporter);
            });
        });
    }
}

impl EncodingsView {
    /// One row per encoding; the evidence is cut at the window's edge (it can run to a
    /// paragraph) with the whole of it on hover.
    fn verdicts_ui(ui: &mut egui::Ui, results: &Results) {
        let evidence_width = (ui.available_width() - 320.0).max(160.0);
        egui::Grid::new("verdicts").striped(true).show(ui, |ui| {
            ui.strong("encoding");
            ui.strong("sum of exp(bias)");
            ui.strong("evidence");
            ui.end_row();
            for (label, e) in results.bias.entries() {
                ui.label(label);
                ui.label(&e.verdict);
                ui.scope(|ui| {
                    ui.set_max_width(evidence_width);
                    // Cut at the column's edge, the whole on hover: ours, not also egui's
                    // own for a cut label (the text showed twice).
                    let cell = egui::Label::new(&e.evidence)
                        .truncate()
                        .show_tooltip_when_elided(false);
                    ui.add(cell).on_hover_text(&e.evidence);
                });
                ui.end_row();
            }
        });
    }
}

/// The encodings' TRF curves (`attnlab trf`'s figure) with the selected run's ERF and its
/// encoding's TRF (`attnlab erf`'s curves) on the same axes.
fn trf_plot(ui: &mut egui::Ui, results: &Results, height: f32, exporter: &Exporter) {
    let (figure, drawn) = &results.figures.trf;
    let title = "TRF: receptive field / m against ε";
    exporter.titled(ui, title, "trf", || figure.clone());
    if let Some(Err(error)) = &results.run {
        ui.colored_label(ui.visuals().warn_fg_color, format!("selected run's ERF: {error}"));
    }
    if !drawn {
        let what = "no theoretical receptive field (TRF)";
        empty_plot(ui, height, no_bias_note(results, what));
        return;
    }
    curves_plot(ui, figure, height);
}

/// A figure of curves at the height the view gives its plots.
fn curves_plot(ui: &mut egui::Ui, figure: &Figure, height: f32) {
    let options = PlotOptions {
        height,
        ..PlotOptions::default()
    };
    show_figure(ui, figure, &options);
}

/// exp(bias) by distance: `attnlab bias`'s figure.
fn exp_bias_plot(ui: &mut egui::Ui, results: &Results, height: f32, exporter: &Exporter) {
    let (figure, has_bias) = &results.figures.exp_bias;
    let title = "exp(bias) by distance (log axes)";
    exporter.titled(ui, title, "exp-bias", || figure.clone());
    if !has_bias {
        let what = "no exp(bias) by distance";
        empty_plot(ui, height, no_bias_note(results, what));
        return;
    }
    curves_plot(ui, figure, height);
}

/// Why a bias plot is empty: none of the shown encodings adds a relative bias to the logits.
fn no_bias_note(results: &Results, what: &str) -> String {
    let names: Vec<&str> = results.bias.entries().map(|(label, _)| label.as_str()).collect();
    format!(
        "{} adds no relative bias to the attention logits (absolute or rotary), so there is {what} \
         to draw. Tick a relative encoding above (alibi, t5, kerple-log, …) to compare.",
        names.join(", ")
    )
}

/// The rotary encodings' long-range decay bounds: `attnlab trf`'s `decay` figure.
fn decay_plot(ui: &mut egui::Ui, results: &Results, height: f32, exporter: &Exporter) {
    let Some(figure) = &results.figures.decay else {
        ui.label(
            "Tick a rotary encoding to see its long-range decay (rotary encodings have no TRF).",
        );
        return;
    };
    let title = "rotary long-range decay (content-free; not a TRF)";
    exporter.titled(ui, title, "rotary-decay", || figure.clone());
    curves_plot(ui, figure, height);
}

fn heatmap_ui(
    ui: &mut egui::Ui,
    results: &Results,
    texture: &mut Option<(egui::TextureHandle, ColourScale)>,
    height: f32,
    exporter: &Exporter,
) {
    let Some((label, n, values)) = &results.heatmap else {
        ui.label("This encoding adds no logit bias, so there is no exp(bias) heatmap.");
        return;
    };
    exporter.titled(ui, format!("exp(bias) heatmap: {label}"), "exp-bias-heatmap", || {
        fig::exp_bias_heatmap(label, *n, values.clone(), "mean over heads")
    });
    let (texture, scale) = texture.get_or_insert_with(|| {
        let floats: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let scale = ColourScale::of(&floats, true);
        let image = scale.image(&floats, *n, *n);
        let texture =
            ui.ctx()
                .load_texture("exp-bias-heatmap", image, egui::TextureOptions::NEAREST);
        (texture, scale)
    });
    scale.legend(ui, "exp(bias)");
    axes_note(ui, QUERY_KEY_AXES);
    let side = height.min(ui.available_width());
    ui.add(egui::Image::new((texture.id(), egui::vec2(side, side))));
}
