//! The experiment editor: every preset field a user changes often, as a widget with its valid
//! range, and the preset's own validation shown inline (Start is disabled while it fails).

use std::path::PathBuf;

use eframe::egui;

use crate::Preset;
use crate::attention::MechanismSpec;
use crate::encodings::EncodingSpec;
use crate::model::{Activation, Head, Layout, MixerKind, ModelConfig};
use crate::ops::Precision;
use crate::settings::{Choices, Hyperparameter, Section, Switch};
use crate::tasks::Split;
use crate::tasks::lm::{LmConfig, Tokens};
use crate::tasks::mad::{MadConfig, Probe};
use crate::tasks::mqar::MqarConfig;
use crate::tasks::{TASKS, TaskSpec};
use crate::train::{Metric, Schedule, TrainConfig};

/// The preset being edited, where it came from, and what was last saved.
pub struct Editor {
    pub preset: Preset,
    pub path: Option<PathBuf>,
    saved: String,
    /// Validation and serialisation of the preset as it was at the last [`Editor::refresh`]:
    /// both are too slow to redo several times in every frame.
    checked: Checked,
}

/// What the editor derived from one version of the preset.
#[derive(Default)]
struct Checked {
    preset: Option<Preset>,
    problem: Option<String>,
    /// What a run of the preset needs in memory (when it is valid).
    memory: Option<crate::preset::MemoryEstimate>,
    toml: Option<String>,
}

impl Editor {
    pub fn new(preset: Preset, path: Option<PathBuf>) -> Self {
        let saved = preset.to_toml().unwrap_or_default();
        let mut editor = Self {
            preset,
            path,
            saved,
            checked: Checked::default(),
        };
        editor.refresh();
        editor
    }

    /// Re-validates and re-serialises the preset if it changed since the last call (once a frame).
    pub fn refresh(&mut self) {
        if self.checked.preset.as_ref() == Some(&self.preset) {
            return;
        }
        let fits = self
            .preset
            .validate()
            .and_then(|()| self.preset.check_fits_here());
        self.checked = Checked {
            preset: Some(self.preset.clone()),
            memory: fits.as_ref().ok().copied(),
            problem: fits.err().map(|e| e.to_string()),
            toml: self.preset.to_toml().ok(),
        };
    }

    /// The validation error of the preset as of the last refresh, if any.
    pub fn problem(&self) -> Option<&str> {
        self.checked.problem.as_deref()
    }

    /// What a run of the preset needs in memory, as of the last refresh (when it is valid
    /// and fits).
    pub fn memory(&self) -> Option<&crate::preset::MemoryEstimate> {
        self.checked.memory.as_ref()
    }

    /// Whether the preset differs from the file it was loaded from or saved to.
    pub fn is_dirty(&self) -> bool {
        self.checked.toml.as_deref() != Some(self.saved.as_str())
    }

    /// Records that the current preset was saved to `path`.
    pub fn mark_saved(&mut self, path: PathBuf) {
        self.refresh();
        self.saved = self.checked.toml.clone().unwrap_or_default();
        self.path = Some(path);
    }

    /// The preset's mechanism and encoding, as presets spell them.
    fn kinds(&self) -> (&'static str, &'static str) {
        (self.preset.attention.name(), self.preset.encoding.name())
    }

    pub fn ui(&mut self, ui: &mut egui::Ui) {
        ui.horizontal(|ui| {
            let label = ui.label("Name");
            ui.text_edit_singleline(&mut self.preset.name)
                .labelled_by(label.id)
                .on_hover_text(key_hint("name"));
        });
        ui.horizontal(|ui| {
            let label = ui.label("Description");
            ui.text_edit_singleline(&mut self.preset.description)
                .labelled_by(label.id)
                .on_hover_text(key_hint("description"));
        });
        let before = self.kinds();
        egui::CollapsingHeader::new("Attention")
            .default_open(true)
            .show(ui, |ui| mechanism_ui(ui, &mut self.preset.attention));
        egui::CollapsingHeader::new("Positional encoding")
            .default_open(true)
            .show(ui, |ui| encoding_ui(ui, &mut self.preset.encoding));
        // The name follows a picked mechanism or encoding: a Based/T5 run was still called
        // "mqar-softmax".
        let after = self.kinds();
        if after != before {
            let name = &mut self.preset.name;
            *name = crate::preset::renamed(name, before, after);
        }
        egui::CollapsingHeader::new("Model")
            .default_open(true)
            .show(ui, |ui| model_ui(ui, &mut self.preset.model));
        egui::CollapsingHeader::new("Task")
            .default_open(false)
            .show(ui, |ui| task_ui(ui, &mut self.preset.task));
        egui::CollapsingHeader::new("Training")
            .default_open(false)
            .show(ui, |ui| train_ui(ui, &mut self.preset.train));
        egui::CollapsingHeader::new("Saved for the views")
            .default_open(false)
            .show(ui, |ui| {
                number(
                    ui,
                    "attention examples",
                    "eval.attention_examples",
                    &mut self.preset.eval.attention_examples,
                    1..=256,
                )
            });
        self.refresh();
        if let Some(problem) = self.problem() {
            ui.colored_label(ui.visuals().error_fg_color, problem);
        }
    }
}

fn model_ui(ui: &mut egui::Ui, m: &mut ModelConfig) {
    number(ui, "d_model", "model.d_model", &mut m.d_model, 4..=2048);
    number(ui, "layers", "model.n_layers", &mut m.n_layers, 1..=24);
    number(ui, "heads", "model.n_heads", &mut m.n_heads, 1..=64);
    number(
        ui,
        "MLP ratio (0 = none)",
        "model.mlp_ratio",
        &mut m.mlp_ratio,
        0..=8,
    );
    if m.mlp_ratio > 0 {
        ui.horizontal(|ui| {
            let label = ui.label("MLP activation");
            let name = |a: Activation| match a {
                Activation::Gelu => "gelu",
                Activation::GeluTanh => "gelu-tanh",
            };
            egui::ComboBox::from_id_salt("activation")
                .selected_text(name(m.activation))
                .show_ui(ui, |ui| {
                    ui.selectable_value(&mut m.activation, Activation::Gelu, "gelu")
                        .on_hover_text("exact, with the erf (PyTorch's nn.GELU(), Pythia)");
                    ui.selectable_value(&mut m.activation, Activation::GeluTanh, "gelu-tanh")
                        .on_hover_text("the tanh approximation (GPT-2's and GPT-Neo's gelu_new)");
                })
                .response
                .labelled_by(label.id)
                .on_hover_text(key_hint("model.activation"));
        });
        ui.checkbox(&mut m.parallel_residual, "parallel residual")
            .on_hover_text(format!(
                "x + mixer(norm(x)) + mlp(norm(x)) in each block, as GPT-NeoX and Pythia; {}",
                key_hint("model.parallel_residual")
            ));
    }
    mixers_ui(ui, &mut m.mixers);
    if m.mixers.contains(&MixerKind::ShortConv) {
        number(
            ui,
            "conv kernel",
            "model.conv_kernel",
            &mut m.conv_kernel,
            1..=64,
        );
    }
    ui.horizontal(|ui| {
        let label = ui.label("layout");
        egui::ComboBox::from_id_salt("layout")
            .selected_text(m.layout.name())
            .show_ui(ui, |ui| {
                for layout in Layout::ALL {
                    ui.selectable_value(&mut m.layout, layout, layout.name())
                        .on_hover_text(layout.summary());
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(format!(
                "how the architecture is built (docs/presets.md); {}",
                key_hint("model.layout")
            ));
    });
    // auto: MAD's auto-encoder for compression, the LM head otherwise.
    named_choice(ui, "head", "model.head", &mut m.head, &Head::ALL, |h| {
        h.name().to_string()
    });
    if m.layout != Layout::Zoology {
        ui.checkbox(&mut m.tie_embeddings, "tie embeddings with the output head")
            .on_hover_text(key_hint("model.tie_embeddings"));
    }
    optional_rate(
        ui,
        "embedding dropout",
        "model.embed_dropout",
        &mut m.embed_dropout,
        m.layout.embed_dropout(),
    );
    optional_rate(
        ui,
        "attention dropout (softmax)",
        "model.attention_dropout",
        &mut m.attention_dropout,
        m.layout.attention_dropout(),
    );
}

/// A rate in [0, 1) that may be left to a default (shown as "auto (default)").
fn optional_rate(ui: &mut egui::Ui, label: &str, key: &str, value: &mut Option<f64>, default: f64) {
    ui.horizontal(|ui| {
        ui.label(label).on_hover_text(key_hint(key));
        match value {
            Some(rate) => {
                ui.add(within(egui::DragValue::new(rate).range(0.0..=0.95)).speed(0.01));
                if ui
                    .button("auto")
                    .on_hover_text("use the layout's")
                    .clicked()
                {
                    *value = None;
                }
            }
            None => {
                ui.label(format!("auto ({default})"));
                if ui.button("set").clicked() {
                    *value = Some(default);
                }
            }
        }
    });
}

/// The cyclic mixer pattern: one picker per entry, with add and remove.
fn mixers_ui(ui: &mut egui::Ui, mixers: &mut Vec<MixerKind>) {
    const KINDS: [MixerKind; 3] = [
        MixerKind::Attention,
        MixerKind::ShortConv,
        MixerKind::PrevToken,
    ];
    ui.label("mixers (repeated over the layers)")
        .on_hover_text(format!(
            "attention, zoology's short convolution, or a fixed shift by one token; {}",
            key_hint("model.mixers")
        ));
    let mut remove = None;
    for (i, mixer) in mixers.iter_mut().enumerate() {
        ui.horizontal(|ui| {
            choice(ui, &format!("mixer {i}"), "model.mixers", mixer, &KINDS);
            if ui
                .small_button("-")
                .on_hover_text("remove this mixer")
                .clicked()
            {
                remove = Some(i);
            }
        });
    }
    if let Some(i) = remove {
        mixers.remove(i);
    }
    if ui.small_button("+ mixer").clicked() {
        mixers.push(MixerKind::Attention);
    }
}

/// The task picker (the tasks' catalogue, each with its summary and paper) and the chosen
/// task's settings.
fn task_ui(ui: &mut egui::Ui, task: &mut TaskSpec) {
    ui.horizontal(|ui| {
        let label = ui.label("task");
        egui::ComboBox::from_id_salt("task")
            .selected_text(task.name())
            .show_ui(ui, |ui| {
                for facts in &TASKS {
                    let selected = facts.name == task.name();
                    let hover = format!("{} ({})", facts.summary, facts.paper);
                    let picked = ui
                        .selectable_label(selected, facts.name)
                        .on_hover_text(hover);
                    if picked.clicked() && !selected {
                        *task = (facts.default)();
                    }
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(key_hint("task"));
    });
    match task {
        TaskSpec::Mqar(t) => mqar_ui(ui, t),
        TaskSpec::Lm(t) => lm_ui(ui, t),
        TaskSpec::Mad(t) => mad_ui(ui, t),
    }
}

/// A MAD probe: which, the settings its `changes` vary (each showing the probe's baseline until
/// changed), and its first training and test rows.
fn mad_ui(ui: &mut egui::Ui, t: &mut MadConfig) {
    ui.horizontal(|ui| {
        let label = ui.label("probe");
        egui::ComboBox::from_id_salt("mad probe")
            .selected_text(t.probe.name())
            .show_ui(ui, |ui| {
                for probe in Probe::ALL {
                    if ui
                        .selectable_label(t.probe == probe, probe.name())
                        .clicked()
                        && t.probe != probe
                    {
                        // Another probe starts from its own baseline.
                        *t = MadConfig {
                            probe,
                            ..MadConfig::default()
                        };
                    }
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(key_hint("task.probe"));
    });
    let resolved = t.resolved();
    let optional =
        |ui: &mut egui::Ui, label: &str, key: &str, value: &mut Option<usize>, shown: usize| {
            let mut v = value.unwrap_or(shown);
            number(ui, label, key, &mut v, 1..=1_000_000);
            if v != shown {
                *value = Some(v);
            }
        };
    optional(
        ui,
        "vocabulary",
        "task.vocab_size",
        &mut t.vocab_size,
        resolved.vocab_size,
    );
    optional(
        ui,
        "length L",
        "task.length",
        &mut t.length,
        resolved.length,
    );
    optional(
        ui,
        "training rows",
        "task.train_examples",
        &mut t.train_examples,
        resolved.train_examples,
    );
    optional(
        ui,
        "test rows",
        "task.test_examples",
        &mut t.test_examples,
        resolved.test_examples,
    );
    match t.probe {
        Probe::NoisyInContextRecall => {
            optional(
                ui,
                "noise tokens",
                "task.noise_vocab_size",
                &mut t.noise_vocab_size,
                resolved.noise_vocab_size,
            );
            let mut frac = t.frac_noise.unwrap_or(resolved.frac_noise);
            real(
                ui,
                "noise fraction",
                "task.frac_noise",
                &mut frac,
                0.0..=1.0,
                0.01,
            );
            if frac != resolved.frac_noise {
                t.frac_noise = Some(frac);
            }
        }
        Probe::FuzzyInContextRecall => {
            optional(
                ui,
                "key motif size",
                "task.k_motif_size",
                &mut t.k_motif_size,
                resolved.k_motif_size,
            );
            optional(
                ui,
                "value motif size",
                "task.v_motif_size",
                &mut t.v_motif_size,
                resolved.v_motif_size,
            );
        }
        Probe::SelectiveCopying => {
            optional(
                ui,
                "tokens to copy",
                "task.num_tokens_to_copy",
                &mut t.num_tokens_to_copy,
                resolved.num_tokens_to_copy,
            );
        }
        _ => {}
    }
    let resolved = t.resolved();
    if let Some(dir) = &t.data {
        // Reading the files on every frame would stall the window: `attnlab data` shows them.
        ui.label(format!("rows from mad-lab's data in {}", dir.display()))
            .on_hover_text(key_hint("task.data"));
    } else if resolved.validate().is_ok() {
        for (split, name) in [(Split::Train, "train"), (Split::Test, "test")] {
            if let Some(row) = resolved.rows(split, 1).first() {
                ui.label(
                    egui::RichText::new(sample_row(name, row))
                        .small()
                        .monospace(),
                )
                .on_hover_text(
                    "the first row: tokens, and under each the label scored there (- none)",
                );
            }
        }
    }
}

/// A row as two lines, tokens over their labels, cut at 48 positions, under its split.
fn sample_row(split: &str, row: &crate::tasks::Row) -> String {
    format!("{split} row\n{}", row.text(48))
}

/// Language modelling: the corpus (a built-in one or any UTF-8 file or folder) and its split.
fn lm_ui(ui: &mut egui::Ui, t: &mut LmConfig) {
    ui.horizontal(|ui| {
        let label = ui.label("corpus");
        ui.add(egui::TextEdit::singleline(&mut t.corpus).desired_width(140.0))
            .labelled_by(label.id)
            .on_hover_text(format!(
                "a built-in corpus, or the path of a UTF-8 file or folder; {}",
                key_hint("task.corpus")
            ));
        egui::ComboBox::from_id_salt("corpus")
            .selected_text("built-in")
            .show_ui(ui, |ui| {
                for name in ["auto", "cargo-registry", "rust-docs", "generated"] {
                    ui.selectable_value(&mut t.corpus, name.to_string(), name);
                }
            });
    });
    choice(
        ui,
        "tokens",
        "task.tokens",
        &mut t.tokens,
        &[Tokens::Bytes, Tokens::Chars],
    );
    if t.tokens == Tokens::Chars {
        number(
            ui,
            "vocabulary",
            "task.vocab_size",
            &mut t.vocab_size,
            2..=65_536,
        );
    }
    number(
        ui,
        "training length L",
        "task.seq_len",
        &mut t.seq_len,
        4..=8192,
    );
    number(
        ui,
        "training bytes read",
        "task.train_bytes",
        &mut t.train_bytes,
        1024..=1_000_000_000,
    );
    number(
        ui,
        "validation bytes read",
        "task.valid_bytes",
        &mut t.valid_bytes,
        1024..=1_000_000_000,
    );
    ui.horizontal(|ui| {
        let label = ui.label("validation share (%)");
        ui.add(within(
            egui::DragValue::new(&mut t.val_percent).range(1..=90),
        ))
        .labelled_by(label.id)
        .on_hover_text(key_hint("task.val_percent"));
    });
    number(
        ui,
        "training windows",
        "task.train_examples",
        &mut t.train_examples,
        1..=10_000_000,
    );
    number(
        ui,
        "test windows",
        "task.test_examples",
        &mut t.test_examples,
        1..=100_000,
    );
    seed(ui, "data seed", "task.seed", &mut t.seed);
}

fn mqar_ui(ui: &mut egui::Ui, t: &mut MqarConfig) {
    number(
        ui,
        "vocabulary",
        "task.vocab_size",
        &mut t.vocab_size,
        8..=65_536,
    );
    number(
        ui,
        "sequence length",
        "task.seq_len",
        &mut t.seq_len,
        4..=8192,
    );
    number(
        ui,
        "key-value pairs",
        "task.num_kv_pairs",
        &mut t.num_kv_pairs,
        1..=1024,
    );
    real(ui, "query gap power a", "task.power_a", &mut t.power_a, 0.0..=1.0, 0.001)
        .on_hover_text("query gaps g are drawn with p(g) ~ a (g+1)^(a-1): small a spreads queries far from their keys");
    ui.checkbox(&mut t.random_non_queries, "random tokens between queries")
        .on_hover_text(key_hint("task.random_non_queries"));
    number(
        ui,
        "passes over the pairs",
        "task.num_passes",
        &mut t.num_passes,
        1..=16,
    );
    number(
        ui,
        "training examples",
        "task.train_examples",
        &mut t.train_examples,
        1..=1_000_000,
    );
    number(
        ui,
        "test examples",
        "task.test_examples",
        &mut t.test_examples,
        1..=100_000,
    );
    seed(ui, "data seed", "task.seed", &mut t.seed);
    optional(
        ui,
        "own test seed (else seed + 10)",
        "task.test_seed",
        &mut t.test_seed,
        1,
    );
}

fn train_ui(ui: &mut egui::Ui, t: &mut TrainConfig) {
    number(
        ui,
        "batch size",
        "train.batch_size",
        &mut t.batch_size,
        1..=4096,
    );
    real(ui, "learning rate", "train.lr", &mut t.lr, 1e-6..=1.0, 1e-4);
    choice(
        ui,
        "schedule",
        "train.schedule",
        &mut t.schedule,
        &[Schedule::Cosine, Schedule::CosineEpochs, Schedule::Constant],
    );
    if t.schedule != Schedule::Constant {
        real(
            ui,
            "final learning rate",
            "train.min_lr",
            &mut t.min_lr,
            0.0..=1.0,
            1e-5,
        );
    }
    number(
        ui,
        "warm-up steps",
        "train.warmup_steps",
        &mut t.warmup_steps,
        0..=100_000,
    );
    real(
        ui,
        "weight decay",
        "train.weight_decay",
        &mut t.weight_decay,
        0.0..=10.0,
        1e-3,
    );
    real(ui, "beta1", "train.beta1", &mut t.beta1, 0.0..=0.9999, 1e-3);
    real(ui, "beta2", "train.beta2", &mut t.beta2, 0.0..=0.9999, 1e-4);
    real(ui, "eps", "train.eps", &mut t.eps, 1e-12..=0.1, 1e-9);
    real(
        ui,
        "gradient clip (0 = off)",
        "train.grad_clip",
        &mut t.grad_clip,
        0.0..=100.0,
        0.01,
    );
    number(ui, "epochs", "train.epochs", &mut t.epochs, 1..=10_000);
    optional(
        ui,
        "stop after max steps",
        "train.max_steps",
        &mut t.max_steps,
        1000,
    );
    number(
        ui,
        "evaluate every (0 = epoch)",
        "train.eval_every",
        &mut t.eval_every,
        0..=1_000_000,
    );
    real(
        ui,
        "target accuracy (0 = none)",
        "train.target_accuracy",
        &mut t.target_accuracy,
        0.0..=1.0,
        1e-3,
    );
    choice(
        ui,
        "accuracy (target, summary)",
        "train.metric",
        &mut t.metric,
        &[Metric::Micro, Metric::Macro],
    );
    seed(ui, "seed", "train.seed", &mut t.seed);
    ui.horizontal(|ui| {
        let label = ui.label("device");
        egui::ComboBox::from_id_salt("device")
            .selected_text(t.device.to_string())
            .show_ui(ui, |ui| {
                for (name, unusable) in crate::device::picker() {
                    let text = match unusable {
                        Some(_) => format!("{name} (does not open here)"),
                        None => name.to_string(),
                    };
                    let item = ui.selectable_value(&mut t.device, name, text);
                    if let Some(why) = unusable {
                        item.on_hover_text(why);
                    }
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(format!(
                "devices this build supports (rebuild with --features cuda or metal for GPUs); \
                 one that does not open here falls back to the CPU with a notice; {}",
                key_hint("train.device")
            ));
    });
    precision_ui(ui, &mut t.precision);
    ui.checkbox(&mut t.tensorboard, "TensorBoard event file")
        .on_hover_text(format!(
            "also log scalars, attention maps and the settings for `tensorboard --logdir runs/`; {}",
            key_hint("train.tensorboard")
        ));
}

/// The `train.precision` picker, what each costs on hover.
fn precision_ui(ui: &mut egui::Ui, precision: &mut Precision) {
    ui.horizontal(|ui| {
        let label = ui.label("precision");
        egui::ComboBox::from_id_salt("precision")
            .selected_text(precision.name())
            .show_ui(ui, |ui| {
                for option in Precision::ALL {
                    ui.selectable_value(precision, option, option.name())
                        .on_hover_text(option.summary());
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(format!(
                "{}; {}",
                precision.summary(),
                key_hint("train.precision")
            ));
    });
}

/// A labelled real-number field limited to `range`, dragged in steps of `speed`.
fn real(
    ui: &mut egui::Ui,
    label: &str,
    key: &str,
    value: &mut f64,
    range: std::ops::RangeInclusive<f64>,
    speed: f64,
) -> egui::Response {
    ui.horizontal(|ui| {
        let label = ui.label(label);
        ui.add(
            within(egui::DragValue::new(value).range(range))
                .speed(speed)
                .max_decimals(8),
        )
        .labelled_by(label.id)
        .on_hover_text(key_hint(key))
    })
    .inner
}

/// A setting that may be absent: a checkbox, and the number when ticked.
fn optional<T: egui::emath::Numeric>(
    ui: &mut egui::Ui,
    label: &str,
    key: &str,
    value: &mut Option<T>,
    default: T,
) {
    ui.horizontal(|ui| {
        let mut present = value.is_some();
        let checkbox = ui
            .checkbox(&mut present, label)
            .on_hover_text(key_hint(key));
        if checkbox.changed() {
            *value = present.then_some(default);
        }
        if let Some(number) = value {
            ui.add(egui::DragValue::new(number));
        }
    });
}

fn seed(ui: &mut egui::Ui, label: &str, key: &str, value: &mut u64) {
    ui.horizontal(|ui| {
        let label = ui.label(label);
        ui.add(egui::DragValue::new(value))
            .labelled_by(label.id)
            .on_hover_text(key_hint(key));
    });
}

/// `field` limiting what the user types or drags to its range, but showing a value from a
/// preset file or `--set` as it is: egui clamps an existing value by default, so drawing the
/// editor changed the preset (a loaded d_model 8192 trained at 2048, with 24 layers for 64).
/// Validation and the memory check say what cannot run.
pub(crate) fn within(field: egui::DragValue<'_>) -> egui::DragValue<'_> {
    field.clamp_existing_to_range(false)
}

/// A labelled whole-number field limited to `range`.
fn number(
    ui: &mut egui::Ui,
    label: &str,
    key: &str,
    value: &mut usize,
    range: std::ops::RangeInclusive<usize>,
) {
    ui.horizontal(|ui| {
        let label = ui.label(label);
        ui.add(within(egui::DragValue::new(value).range(range)))
            .labelled_by(label.id)
            .on_hover_text(key_hint(key));
    });
}

/// A labelled combo box over `options`, shown by their Debug names.
fn choice<T: Copy + PartialEq + std::fmt::Debug>(
    ui: &mut egui::Ui,
    label: &str,
    key: &str,
    value: &mut T,
    options: &[T],
) {
    named_choice(ui, label, key, value, options, |option| {
        format!("{option:?}")
    });
}

/// A labelled combo box over `options`, shown by `name`.
fn named_choice<T: Copy + PartialEq>(
    ui: &mut egui::Ui,
    label: &str,
    key: &str,
    value: &mut T,
    options: &[T],
    name: impl Fn(&T) -> String,
) {
    ui.horizontal(|ui| {
        let label_id = ui.label(label).id;
        egui::ComboBox::from_id_salt((label, key))
            .selected_text(name(value))
            .show_ui(ui, |ui| {
                for option in options {
                    ui.selectable_value(value, *option, name(option));
                }
            })
            .response
            .labelled_by(label_id)
            .on_hover_text(key_hint(key));
    });
}

/// What a control's tooltip says about the preset key it sets, so the window teaches the
/// command line's `--set`.
fn key_hint(key: &str) -> String {
    format!("preset key {key}; on the command line: --set {key}=…")
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
                        .on_hover_text(format!("{}\n{}", choice.formula(), choice.summary()));
                    if response.clicked() && !selected {
                        *spec = choice;
                    }
                }
            })
            .response
            .labelled_by(label.id);
    })
    .response
    .on_hover_text(format!(
        "{}\n{}\n{}",
        spec.formula(),
        spec.summary(),
        key_hint("attention")
    ));
    settings_ui(ui, spec);
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
                    let response =
                        ui.selectable_label(selected, choice.name())
                            .on_hover_text(format!(
                                "{}{learned}\n{}",
                                choice.formula(),
                                choice.summary()
                            ));
                    if response.clicked() && !selected {
                        *spec = choice;
                    }
                }
            })
            .response
            .labelled_by(label.id)
            .on_hover_text(key_hint("encoding"));
    });
    ui.label(egui::RichText::new(spec.formula()).small().weak())
        .on_hover_text(format!("{}\n{}", spec.summary(), key_hint("encoding")));
    settings_ui(ui, spec);
}

/// A widget per setting of a mechanism or encoding, as its catalogue entry lists them: a
/// slider over each number's valid range, a checkbox or a choice for each switch.
fn settings_ui<S: Section>(ui: &mut egui::Ui, spec: &mut S) {
    for hyper in spec.hyperparameters() {
        hyperparameter_ui(ui, spec, hyper);
    }
    for switch in spec.switches() {
        switch_ui(ui, spec, switch);
    }
}

/// The slider of one numeric setting, or "auto" and a button to set it while it is unset.
fn hyperparameter_ui<S: Section>(ui: &mut egui::Ui, spec: &mut S, hyper: &Hyperparameter) {
    ui.horizontal(|ui| {
        let key = format!("{}.{}", S::SECTION, hyper.key);
        let help = format!("{}\n{}", hyper.help, key_hint(&key));
        ui.label(hyper.key).on_hover_text(&help);
        match spec.value(hyper.key) {
            Some(mut value) => {
                let slider = egui::Slider::new(&mut value, hyper.min..=hyper.max)
                    .clamping(egui::SliderClamping::Edits)
                    .logarithmic(hyper.log_scale)
                    .integer_if(hyper.integer);
                if ui.add(slider).on_hover_text(&help).changed()
                    && let Ok(changed) = spec.with_value(hyper.key, value)
                {
                    *spec = changed;
                }
            }
            None => {
                ui.label("auto");
                if ui.button("set").on_hover_text(&help).clicked()
                    && let Ok(changed) = spec.with_value(hyper.key, hyper.min.max(1.0))
                {
                    *spec = changed;
                }
            }
        }
    });
}

/// The checkbox or choice of one switch; the value picked is written back by key.
fn switch_ui<S: Section>(ui: &mut egui::Ui, spec: &mut S, switch: &Switch) {
    let key = format!("{}.{}", S::SECTION, switch.key);
    let current = spec.word(switch.key).unwrap_or_default();
    let picked = match switch.choices {
        Choices::Toggle => {
            let mut on = current == "true";
            ui.checkbox(&mut on, switch.label)
                .on_hover_text(key_hint(&key))
                .changed()
                .then(|| on.to_string())
        }
        Choices::Words(words) => {
            let mut word = words
                .iter()
                .copied()
                .find(|w| *w == current)
                .unwrap_or_default();
            named_choice(ui, switch.label, &key, &mut word, words, |w| w.to_string());
            (word != current).then(|| word.to_string())
        }
    };
    if let Some(word) = picked
        && let Ok(changed) = spec.with_setting(switch.key, &word)
    {
        *spec = changed;
    }
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
