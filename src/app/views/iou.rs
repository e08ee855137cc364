//! IoU of attention against the MQAR ground truth (issue 6): the protocol, the layers × heads
//! table of the selected run (its [`IouReport`], as `attnlab iou` prints it), a bar chart across
//! every run computed so far, and one example's cropped attention beside its ground truth.

use eframe::egui;

use super::super::export::Exporter;
use super::super::jobs::{Job, Jobs, take_result};
use super::super::plot::{PlotOptions, show_figure};
use super::super::runs::RunStore;
use super::colour::ColourScale;
use super::{
    Analysed, PerRun, RunList, View, ViewContext, analyse_runs, left_out_line,
    missing_analysis_text, run_buttons,
};
use crate::analysis::TrainedRun;
use crate::analysis::figures::recall;
use crate::analysis::iou::{
    Binarise, ExampleIou, IouProtocol, IouTable, Target, example_iou, run_iou,
};
use crate::report::recall::IouReport;
use crate::report::{Report, replace_runs};

/// One example's crops as textures, with the numbers behind them.
struct ShownExample {
    example: ExampleIou,
    mechanism: String,
    attention: (egui::TextureHandle, ColourScale),
    truth: egui::TextureHandle,
}

pub struct IouView {
    pub protocol: IouProtocol,
    /// Reports computed so far, one per run folder (a recomputation replaces it).
    pub reports: Vec<PerRun<IouReport>>,
    job: Option<Job<Analysed<IouReport>>>,
    row: usize,
    layer: usize,
    head: usize,
    example_job: Option<Job<(ExampleIou, String)>>,
    example: Option<ShownExample>,
    pub error: Option<String>,
    /// The runs the last computation left out, and why.
    pub left_out: Option<String>,
}

impl Default for IouView {
    fn default() -> Self {
        Self {
            protocol: IouProtocol::default(),
            reports: Vec::new(),
            job: None,
            row: 0,
            layer: 1,
            head: 0,
            example_job: None,
            example: None,
            error: None,
            left_out: None,
        }
    }
}

impl IouView {
    /// Whether an example's crops are on screen.
    pub fn has_example(&self) -> bool {
        self.example.is_some()
    }
}

impl View for IouView {
    fn is_busy(&self) -> bool {
        self.job.is_some()
    }

    fn analyse(&mut self, jobs: &Jobs, runs: RunList) {
        self.compute(jobs, runs);
    }

    fn prepare_demo(&mut self) -> bool {
        !self.reports.is_empty()
    }

    /// The screenshot's table over 1000 examples.
    fn start_demo(&mut self, jobs: &Jobs, runs: RunList) {
        self.protocol.examples = 1000;
        self.compute(jobs, runs);
    }

    fn logic(&mut self, cx: &ViewContext) {
        self.collect(cx.ctx);
    }

    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let (runs, exporter) = (cx.runs, cx.exporter);
        self.protocol_ui(ui);
        ui.horizontal(|ui| self.start_ui(ui, cx));
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        if let Some(left_out) = &self.left_out {
            ui.colored_label(ui.visuals().warn_fg_color, left_out);
        }
        ui.separator();
        egui::ScrollArea::vertical().show(ui, |ui| {
            let selected = runs.selected().and_then(|r| r.dir.clone());
            match self
                .reports
                .iter()
                .find(|t| Some(&t.dir) == selected.as_ref())
            {
                Some(run) => table_ui(ui, run, exporter),
                None => {
                    ui.label(missing_analysis_text(
                        runs.selected(),
                        self.job.is_some(),
                        "IoU table",
                    ));
                }
            }
            if !self.reports.is_empty() {
                ui.separator();
                bars_ui(ui, &self.reports, exporter);
            }
            ui.separator();
            self.example_ui(ui, cx);
        });
    }
}

impl IouView {
    /// Takes in whatever the workers finished.
    fn collect(&mut self, ctx: &egui::Context) {
        let cancelled = Some("IoU cancelled");
        if let Some(analysed) = take_result(&mut self.job, &mut self.error, cancelled) {
            self.left_out = left_out_line(&analysed.left_out);
            replace_runs(&mut self.reports, analysed.done, |r| &r.dir);
        }
        if let Some((example, mechanism)) =
            take_result(&mut self.example_job, &mut self.error, None)
        {
            self.example = Some(show_example(ctx, example, mechanism));
        }
    }

    fn protocol_ui(&mut self, ui: &mut egui::Ui) {
        let p = &mut self.protocol;
        ui.horizontal(|ui| {
            let label = ui.label("binarise");
            let name = match p.binarise {
                Binarise::Argmax => "argmax",
                Binarise::TopK(_) => "top-k",
                Binarise::Threshold(_) => "threshold",
            };
            egui::ComboBox::from_id_salt("binarise")
                .selected_text(name)
                .show_ui(ui, |ui| {
                    ui.selectable_value(&mut p.binarise, Binarise::Argmax, "argmax");
                    if ui.selectable_label(name == "top-k", "top-k").clicked() {
                        p.binarise = Binarise::TopK(2);
                    }
                    if ui
                        .selectable_label(name == "threshold", "threshold")
                        .clicked()
                    {
                        p.binarise = Binarise::Threshold(0.1);
                    }
                })
                .response
                .labelled_by(label.id);
            match &mut p.binarise {
                Binarise::TopK(k) => {
                    ui.add(egui::DragValue::new(k).range(1..=64).prefix("k = "));
                }
                Binarise::Threshold(t) => {
                    ui.add(
                        egui::DragValue::new(t)
                            .range(0.0..=0.99)
                            .speed(0.01)
                            .prefix("τ = "),
                    );
                }
                Binarise::Argmax => {}
            }
            let label = ui.label("target");
            egui::ComboBox::from_id_salt("iou-target")
                .selected_text(p.target.name())
                .show_ui(ui, |ui| {
                    for target in [Target::Value, Target::Key] {
                        ui.selectable_value(&mut p.target, target, target.name());
                    }
                })
                .response
                .labelled_by(label.id);
            let label = ui.label("examples");
            ui.add(egui::DragValue::new(&mut p.examples).range(1..=100_000))
                .labelled_by(label.id);
        });
        ui.label(egui::RichText::new(self.protocol.describe()).small().weak());
    }

    fn start_ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        if let Some(job) = &self.job {
            job.ui(ui);
            return;
        }
        let refusal = |p: &crate::Preset| p.task.lacks_ground_truth();
        if let Some(list) = run_buttons(ui, cx.runs, refusal) {
            self.compute(cx.jobs, list);
        }
    }

    /// Computes the IoU reports of `runs` (name, folder) as a job.
    fn compute(&mut self, jobs: &Jobs, runs: RunList) {
        let protocol = self.protocol;
        // An earlier error would read as this computation's until it ends.
        self.error = None;
        self.job = Some(jobs.spawn("IoU", move |progress, cancel| {
            analyse_runs(&runs, progress, cancel, |run, progress, cancel| {
                let table = run_iou(run, &protocol, progress, cancel)?;
                let path = run.run.path().to_path_buf();
                Ok(table.map(|table| IouReport::new(path, table, None)))
            })
        }));
    }

    fn example_ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let (runs, exporter): (&RunStore, &Exporter) = (cx.runs, cx.exporter);
        ui.strong("One example: attention beside the ground truth");
        ui.horizontal(|ui| {
            let label = ui.label("test row");
            ui.add(egui::DragValue::new(&mut self.row).range(0..=1_000_000))
                .labelled_by(label.id);
            let label = ui.label("layer");
            ui.add(egui::DragValue::new(&mut self.layer).range(0..=64))
                .labelled_by(label.id);
            let label = ui.label("head");
            ui.add(egui::DragValue::new(&mut self.head).range(0..=64))
                .labelled_by(label.id);
            let run = runs
                .selected()
                .filter(|r| !r.is_running())
                .and_then(|r| r.dir.clone());
            if let Some(job) = &self.example_job {
                job.ui(ui);
            } else if ui
                .add_enabled(run.is_some(), egui::Button::new("Show example"))
                .clicked()
                && let Some(dir) = run
            {
                let (row, layer, head, protocol) = (self.row, self.layer, self.head, self.protocol);
                self.example_job = Some(cx.jobs.spawn("IoU example", move |_, _| {
                    let run = TrainedRun::open(&dir)?;
                    let example = example_iou(&run, row, layer, head, &protocol)?;
                    Ok(Some((example, run.preset.attention.name().to_string())))
                }));
            }
        });
        let Some(shown) = &self.example else {
            return;
        };
        let e = &shown.example;
        ui.horizontal_wrapped(|ui| {
            ui.label(format!(
                "row {}, layer {}, head {}: hard IoU {:.3}, soft IoU {:.3}",
                e.row, e.layer, e.head, e.hard, e.soft
            ));
            let [attention, truth] = recall::iou_example(e, &shown.mechanism);
            exporter.buttons(ui, "iou-example-attention", || attention);
            exporter.buttons(ui, "iou-example-truth", || truth);
        });
        shown.attention.1.legend(ui, "weight");
        let rows = e.crop.query_positions.len();
        let side = (ui.available_width() / 2.0 - 10.0).clamp(100.0, 500.0);
        let size = egui::vec2(side, side * rows as f32 / e.crop.context.max(1) as f32);
        ui.horizontal(|ui| {
            ui.vertical(|ui| {
                ui.label("model attention (queries × context)");
                ui.image((shown.attention.0.id(), size));
            });
            ui.vertical(|ui| {
                ui.label("ground truth");
                ui.image((shown.truth.id(), size));
            });
        });
    }
}

/// Uploads an example's two crops.
fn show_example(ctx: &egui::Context, example: ExampleIou, mechanism: String) -> ShownExample {
    let (rows, cols) = (example.crop.query_positions.len(), example.crop.context);
    let upload = |name: &str, values: &[f64]| {
        let floats: Vec<f32> = values.iter().map(|&v| v as f32).collect();
        let scale = ColourScale::of(&floats, false);
        let image = scale.image(&floats, rows, cols);
        let texture = ctx.load_texture(name, image, egui::TextureOptions::NEAREST);
        (texture, scale)
    };
    let attention = upload("iou-attention", &example.attention);
    let (truth, _) = upload("iou-truth", &example.crop.truth);
    ShownExample {
        example,
        mechanism,
        attention,
        truth,
    }
}

/// The layers × heads table of one run, hard and soft, with their spread over examples; its
/// two heatmaps export as the report's figures.
fn table_ui(ui: &mut egui::Ui, run: &PerRun<IouReport>, exporter: &Exporter) {
    let table = &run.value.table;
    ui.horizontal_wrapped(|ui| {
        ui.strong(format!(
            "{}: IoU over {} examples",
            run.name, table.examples
        ));
        let names = [
            ("hard:", "iou-hard"),
            ("soft:", "iou-soft"),
            ("against τ:", "iou-thresholds"),
        ];
        for ((label, name), (_, figure)) in names.into_iter().zip(run.value.figures()) {
            ui.label(label);
            exporter.buttons(ui, name, || figure);
        }
    });
    egui::Grid::new("iou-table").striped(true).show(ui, |ui| {
        ui.strong("layer");
        for head in 0..table.hard.first().map_or(0, Vec::len) {
            ui.strong(format!("head {head}"));
        }
        ui.end_row();
        for (l, layer) in table.layers.iter().enumerate() {
            ui.label(layer.to_string());
            for h in 0..table.hard[l].len() {
                ui.label(format!(
                    "soft {:.3} ± {:.3}\nhard {:.3} ± {:.3}",
                    table.soft[l][h], table.soft_std[l][h], table.hard[l][h], table.hard_std[l][h]
                ))
                .on_hover_text(format!(
                    "soft IoU (Σmin/Σmax) has no threshold; hard IoU binarises each row \
                     ({}): the figure against τ shows whether its ranking holds at every τ",
                    table.protocol.binarise
                ));
            }
            ui.end_row();
        }
    });
}

/// Hard and soft IoU of every computed run, layer and head, side by side: the figure
/// `attnlab iou` saves, drawn as it is (its groups are labelled there, once).
fn bars_ui(ui: &mut egui::Ui, reports: &[PerRun<IouReport>], exporter: &Exporter) {
    let tables: Vec<(String, &IouTable)> = reports
        .iter()
        .map(|r| (r.name.clone(), &r.value.table))
        .collect();
    let figure = recall::iou_bars(&tables);
    let title = "Across runs (mean over examples; the export draws ± std whiskers)";
    exporter.titled(ui, title, "iou-runs", || figure.clone());
    let options = PlotOptions {
        height: 220.0,
        y_range: Some(0.0..=1.0),
        ..PlotOptions::default()
    };
    show_figure(ui, &figure, &options);
    // Hard IoU ranks by where its threshold cuts: the curve over τ says whether a ranking
    // holds, soft IoU (dashed) needs no threshold.
    let thresholds = recall::iou_thresholds(&tables);
    let title = "Hard IoU against its threshold τ, soft IoU dashed";
    exporter.titled(ui, title, "iou-thresholds", || thresholds.clone());
    show_figure(ui, &thresholds, &options);
}
