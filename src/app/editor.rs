//! The experiment editor: every preset field a user changes often, as a widget with its valid
//! range, and the preset's own validation shown inline (Start is disabled while it fails).

use std::path::PathBuf;

use eframe::egui;

use crate::Preset;
use crate::attention::{LinformerSharing, MechanismSpec, RebasedVariant};
use crate::encodings::{DietSharing, EncodingSpec};
use crate::tasks::TaskSpec;

/// The preset being edited, where it came from, and what was last saved.
pub struct Editor {
    pub preset: Preset,
    pub path: Option<PathBuf>,
    saved: String,
}

impl Editor {
    pub fn new(preset: Preset, path: Option<PathBuf>) -> Self {
        let saved = preset.to_toml().unwrap_or_default();
        Self {
            preset,
            path,
            saved,
        }
    }

    /// The validation error of the current preset, if any.
    pub fn problem(&self) -> Option<String> {
        self.preset.validate().err().map(|e| e.to_string())
    }

    /// Whether the preset differs from the file it was loaded from or saved to.
    pub fn is_dirty(&self) -> bool {
        self.preset.to_toml().ok().as_deref() != Some(self.saved.as_str())
    }

    /// Records that the current preset was saved to `path`.
    pub fn mark_saved(&mut self, path: PathBuf) {
        self.saved = self.preset.to_toml().unwrap_or_default();
        self.path = Some(path);
    }

    pub fn ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let label = ui.label("Name");
            ui.text_edit_singleline(&mut self.preset.name)
                .labelled_by(label.id);
        });
        egui::CollapsingHeader::new("Attention")
            .default_open(true)
            .show(ui, |ui| mechanism_ui(ui, &mut self.preset.attention));
        egui::CollapsingHeader::new("Positional encoding")
            .default_open(true)
            .show(ui, |ui| encoding_ui(ui, &mut self.preset.encoding));
        egui::CollapsingHeader::new("Model")
            .default_open(true)
            .show(ui, |ui| self.model_ui(ui));
        egui::CollapsingHeader::new("Task (MQAR)")
            .default_open(false)
            .show(ui, |ui| self.task_ui(ui));
        egui::CollapsingHeader::new("Training")
            .default_open(false)
            .show(ui, |ui| self.train_ui(ui));
        if let Some(problem) = self.problem() {
            ui.colored_label(ui.visuals().error_fg_color, problem);
        }
    }

    fn model_ui(&mut self, ui: &mut egui::Ui) {
        let m = &mut self.preset.model;
        number(ui, "d_model", &mut m.d_model, 4..=2048);
        number(ui, "layers", &mut m.n_layers, 1..=24);
        number(ui, "heads", &mut m.n_heads, 1..=64);
        number(ui, "MLP ratio (0 = none)", &mut m.mlp_ratio, 0..=8);
    }

    fn task_ui(&mut self, ui: &mut egui::Ui) {
        let TaskSpec::Mqar(t) = &mut self.preset.task else {
            ui.label("Edit this task's settings in the preset file.");
            return;
        };
        number(ui, "vocabulary", &mut t.vocab_size, 8..=65_536);
        number(ui, "sequence length", &mut t.seq_len, 4..=8192);
        number(ui, "key-value pairs", &mut t.num_kv_pairs, 1..=1024);
        number(
            ui,
            "training examples",
            &mut t.train_examples,
            1..=1_000_000,
        );
        number(ui, "test examples", &mut t.test_examples, 1..=100_000);
    }

    fn train_ui(&mut self, ui: &mut egui::Ui) {
        let t = &mut self.preset.train;
        number(ui, "batch size", &mut t.batch_size, 1..=4096);
        ui.horizontal(|ui| {
            let label = ui.label("learning rate");
            ui.add(
                egui::DragValue::new(&mut t.lr)
                    .range(1e-6..=1.0)
                    .speed(1e-4)
                    .max_decimals(6),
            )
            .labelled_by(label.id);
        });
        number(ui, "epochs", &mut t.epochs, 1..=10_000);
        number(ui, "warm-up steps", &mut t.warmup_steps, 0..=100_000);
        ui.horizontal(|ui| {
            let label = ui.label("seed");
            ui.add(egui::DragValue::new(&mut t.seed))
                .labelled_by(label.id);
        });
        ui.horizontal(|ui| {
            let label = ui.label("device");
            egui::ComboBox::from_id_salt("device")
                .selected_text(t.device.clone())
                .show_ui(ui, |ui| {
                    for name in crate::device::available() {
                        ui.selectable_value(&mut t.device, name.to_string(), name);
                    }
                })
                .response
                .labelled_by(label.id)
                .on_hover_text(
                    "devices this build supports (rebuild with --features cuda or metal for GPUs)",
                );
        });
    }
}

/// A labelled whole-number field limited to `range`.
fn number(
    ui: &mut egui::Ui,
    label: &str,
    value: &mut usize,
    range: std::ops::RangeInclusive<usize>,
) {
    ui.horizontal(|ui| {
        let label = ui.label(label);
        ui.add(egui::DragValue::new(value).range(range))
            .labelled_by(label.id);
    });
}

/// A labelled combo box over `options`, shown by their Debug names.
fn choice<T: Copy + PartialEq + std::fmt::Debug>(
    ui: &mut egui::Ui,
    label: &str,
    value: &mut T,
    options: &[T],
) {
    ui.horizontal(|ui| {
        let label_id = ui.label(label).id;
        egui::ComboBox::from_id_salt(label)
            .selected_text(format!("{value:?}"))
            .show_ui(ui, |ui| {
                for option in options {
                    ui.selectable_value(value, *option, format!("{option:?}"));
                }
            })
            .response
            .labelled_by(label_id);
    });
}

/// The mechanism picker (formula on hover) and its settings.
fn mechanism_ui(ui: &mut egui::Ui, spec: &mut MechanismSpec) {
    ui.horizontal(|ui| {
        let label = ui.label("mechanism");
        egui::ComboBox::from_id_salt("mechanism")
            .selected_text(spec.name())
            .show_ui(ui, |ui| {
                for choice in MechanismSpec::all_defaults() {
                    let selected = choice.name() == spec.name();
                    let response = ui
                        .selectable_label(selected, choice.name())
                        .on_hover_text(choice.formula());
                    if response.clicked() && !selected {
                        *spec = choice;
                    }
                }
            })
            .response
            .labelled_by(label.id);
    })
    .response
    .on_hover_text(spec.formula());
    match spec {
        MechanismSpec::Based(c) => number(ui, "feature dim", &mut c.feature_dim, 1..=256),
        MechanismSpec::Rebased(c) => {
            number(ui, "feature dim", &mut c.feature_dim, 1..=256);
            let variants = [
                RebasedVariant::Rebased,
                RebasedVariant::X2,
                RebasedVariant::Norm,
                RebasedVariant::Gamma,
                RebasedVariant::GammaBeta,
            ];
            choice(ui, "variant", &mut c.variant, &variants);
        }
        MechanismSpec::Linformer(c) => {
            number(ui, "projected length k", &mut c.proj_dim, 1..=4096);
            let modes = [
                LinformerSharing::None,
                LinformerSharing::Headwise,
                LinformerSharing::Kv,
                LinformerSharing::Layerwise,
            ];
            choice(ui, "sharing", &mut c.sharing, &modes);
        }
        MechanismSpec::Softmax | MechanismSpec::Linear => {}
    }
}

/// The encoding picker (formula on hover) and a slider per setting, with its valid range.
pub fn encoding_ui(ui: &mut egui::Ui, spec: &mut EncodingSpec) {
    ui.horizontal(|ui| {
        let label = ui.label("encoding");
        egui::ComboBox::from_id_salt("encoding")
            .selected_text(spec.name())
            .show_ui(ui, |ui| {
                for choice in EncodingSpec::all_defaults() {
                    let selected = choice.name() == spec.name();
                    let learned = if choice.is_learnable() {
                        " (learned)"
                    } else {
                        ""
                    };
                    let response = ui
                        .selectable_label(selected, choice.name())
                        .on_hover_text(format!("{}{learned}", choice.formula()));
                    if response.clicked() && !selected {
                        *spec = choice;
                    }
                }
            })
            .response
            .labelled_by(label.id);
    });
    ui.label(egui::RichText::new(spec.formula()).small().weak());
    for hyper in spec.hyperparameters() {
        ui.horizontal(|ui| {
            ui.label(hyper.key).on_hover_text(hyper.help);
            match spec.value(hyper.key) {
                Some(mut value) => {
                    let slider = egui::Slider::new(&mut value, hyper.min..=hyper.max)
                        .logarithmic(hyper.log_scale)
                        .integer_if(hyper.integer);
                    if ui.add(slider).on_hover_text(hyper.help).changed()
                        && let Ok(changed) = spec.with_value(hyper.key, value)
                    {
                        *spec = changed;
                    }
                }
                None => {
                    ui.label("auto");
                    if ui.button("set").on_hover_text(hyper.help).clicked()
                        && let Ok(changed) = spec.with_value(hyper.key, hyper.min.max(1.0))
                    {
                        *spec = changed;
                    }
                }
            }
        });
    }
    match spec {
        EncodingSpec::Sandwich(c) => {
            ui.checkbox(&mut c.per_head, "per-head scale k*H/(8h)");
        }
        EncodingSpec::DietRel(c) => sharing_ui(ui, &mut c.sharing),
        EncodingSpec::DietAbs(c) => sharing_ui(ui, &mut c.sharing),
        _ => {}
    }
}

fn sharing_ui(ui: &mut egui::Ui, sharing: &mut DietSharing) {
    ui.horizontal(|ui| {
        ui.label("sharing");
        ui.selectable_value(sharing, DietSharing::None, "none");
        ui.selectable_value(sharing, DietSharing::Layerwise, "layer-wise");
    });
}

/// `Slider::integer` only when asked.
trait IntegerIf {
    fn integer_if(self, integer: bool) -> Self;
}

impl IntegerIf for egui::Slider<'_> {
    fn integer_if(self, integer: bool) -> Self {
        if integer { self.integer() } else { self }
    }
}
