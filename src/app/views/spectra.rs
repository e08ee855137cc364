//! Attention spectra (issue 6, Linformer's Figure 1): the normalised cumulative singular values of
//! the attention matrices of every computed run and layer, and the layers × heads heatmap of the
//! cumulative value at one index for the selected run; drawn and exported from one
//! [`SpectrumReport`], the report `attnlab spectrum` prints.

use eframe::egui;

use super::super::export::Exporter;
use super::super::jobs::{Job, Jobs, take_result};
use super::super::plot::{PlotOptions, show_figure};
use super::{
    RunList, View, ViewContext, analyse_runs, left_out_line, missing_analysis_text, run_buttons,
};
use crate::analysis::spectrum::{SpectrumProtocol, run_spectrum};
use crate::report::recall::{SpectrumEntry, SpectrumReport};

#[derive(Default)]
pub struct SpectraView {
    pub protocol: SpectrumProtocol,
    /// Every run computed so far, one entry per run folder (a recomputation replaces it).
    pub report: SpectrumReport,
    /// The entries computed, and the runs left out with why.
    job: Option<Job<(Vec<SpectrumEntry>, Vec<String>)>>,
    pub error: Option<String>,
    /// The runs the last computation left out, and why.
    pub left_out: Option<String>,
}

impl View for SpectraView {
    fn is_busy(&self) -> bool {
        self.job.is_some()
    }

    fn analyse(&mut self, jobs: &Jobs, runs: RunList) {
        self.compute(jobs, runs);
    }

    fn prepare_demo(&mut self) -> bool {
        !self.report.runs.is_empty()
    }

    /// The screenshot's spectra over 200 examples.
    fn start_demo(&mut self, jobs: &Jobs, runs: RunList) {
        self.protocol.examples = 200;
        self.compute(jobs, runs);
    }

    fn logic(&mut self, _cx: &ViewContext) {
        let cancelled = Some("spectrum cancelled");
        if let Some((entries, left_out)) = take_result(&mut self.job, &mut self.error, cancelled) {
            self.left_out = left_out_line(&left_out);
            self.report.merge(entries);
        }
    }

    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let (runs, exporter) = (cx.runs, cx.exporter);
        self.protocol_ui(ui);
        ui.horizontal(|ui| match &self.job {
            Some(job) => job.ui(ui),
            None => {
                let refusal = |p: &crate::Preset| p.task.lacks_ground_truth();
                if let Some(list) = run_buttons(ui, runs, refusal) {
                    self.compute(cx.jobs, list);
                }
            }
        });
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        if let Some(left_out) = &self.left_out {
            ui.colored_label(ui.visuals().warn_fg_color, left_out);
        }
        ui.separator();
        if self.report.runs.is_empty() {
            ui.label(missing_analysis_text(
                runs.selected(),
                self.job.is_some(),
                "spectra",
            ));
            return;
        }
        self.curves_ui(ui, exporter);
        let selected = runs.selected().and_then(|r| r.dir.clone());
        if let Some(run) = self
            .report
            .runs
            .iter()
            .find(|e| Some(&e.run) == selected.as_ref())
        {
            ui.separator();
            heatmap_ui(ui, run, exporter);
        }
    }
}

impl SpectraView {
    /// Computes the spectra of `runs` (name, folder) as a job.
    fn compute(&mut self, jobs: &Jobs, runs: RunList) {
        let protocol = self.protocol;
        // An earlier error would read as this computation's until it ends.
        self.error = None;
        self.job = Some(jobs.spawn("spectrum", move |progress, cancel| {
            let spectra = analyse_runs(&runs, progress, cancel, |run, progress, cancel| {
                run_spectrum(run, &protocol, progress, cancel)
            })?;
            Ok(spectra.map(|spectra| {
                let entries = spectra
                    .done
                    .into_iter()
                    .map(|r| SpectrumEntry::new(r.dir, r.name, r.value))
                    .collect();
                (entries, spectra.left_out)
            }))
        }));
    }

    fn protocol_ui(&mut self, ui: &mut egui::Ui) {
        let p = &mut self.protocol;
        ui.horizontal(|ui| {
            let label = ui.label("examples");
            ui.add(egui::DragValue::new(&mut p.examples).range(1..=100_000))
                .labelled_by(label.id);
            ui.checkbox(&mut p.squared, "energy (σ²) instead of σ");
            let mut fixed = p.at.is_some();
            if ui
                .checkbox(&mut fixed, "heatmap index")
                .on_hover_text("off: a quarter of the columns")
                .changed()
            {
                p.at = fixed.then_some(32);
            }
            if let Some(at) = &mut p.at {
                ui.add(egui::DragValue::new(at).range(1..=65_536));
            }
        });
    }

    /// The curves: the report's main figure, drawn as its export draws it.
    fn curves_ui(&self, ui: &mut egui::Ui, exporter: &Exporter) {
        let figure = self.report.curves();
        let title = "normalised cumulative singular values (mean over heads)";
        exporter.titled(ui, title, "spectrum", || figure.clone());
        if let Some(first) = self.report.runs.first() {
            let spectrum = &first.spectrum;
            ui.label(
                egui::RichText::new(spectrum.protocol.describe(spectrum.at))
                    .small()
                    .weak(),
            );
        }
        let options = PlotOptions {
            y_range: Some(0.0..=1.0),
            ..PlotOptions::default()
        };
        show_figure(ui, &figure, &options);
    }
}

/// The layers × heads values c(at) of one run, as a coloured table.
fn heatmap_ui(ui: &mut egui::Ui, run: &SpectrumEntry, exporter: &Exporter) {
    let spectrum = &run.spectrum;
    let title = format!(
        "{}: cumulative value at index {} of {}×{} matrices",
        run.label, spectrum.at, spectrum.shape.0, spectrum.shape.1
    );
    exporter.titled(ui, title, "spectrum-heatmap", || run.heatmap());
    egui::Grid::new("spectrum-heatmap").show(ui, |ui| {
        ui.strong("layer");
        for head in 0..spectrum.at_value.first().map_or(0, Vec::len) {
            ui.strong(format!("head {head}"));
        }
        ui.end_row();
        for (l, layer) in spectrum.layers.iter().enumerate() {
            ui.label(layer.to_string());
            for &value in &spectrum.at_value[l] {
                let [r, g, b] = crate::figures::viridis(value);
                let fill = egui::Color32::from_rgb(r, g, b);
                let text = if value > 0.6 {
                    egui::Color32::BLACK
                } else {
                    egui::Color32::WHITE
                };
                egui::Frame::new()
                    .fill(fill)
                    .inner_margin(4.0)
                    .show(ui, |ui| {
                        ui.colored_label(text, format!("{value:.3}"));
                    });
            }
            ui.end_row();
        }
    });
}
