//! A pretrained model from a Hugging Face folder (GPT-2, Pythia, GPT-Neo / TinyStories) reading
//! a text the user types or opens: the layers × heads grid of a head score (previous token,
//! first token, entropy, induction on the probe, the loss change when the head is ablated),
//! each cell a click away from its head's map; the maps of a layer's heads; one head's map on
//! plot axes with the tokens as ticks and on hover. Opening, reading, probing and ablating run
//! as jobs; the model stays loaded while the view shows it.

use std::path::PathBuf;
use std::sync::Arc;

use eframe::egui;
use egui_plot::{GridMark, HoverPosition, PlotImage, PlotPoint};

use super::super::command::Command;
use super::super::export::Exporter;
use super::super::jobs::{Job, Jobs, take_result};
use super::super::plot::titled_plot;
use super::colour::{ColourScale, axes_note};
use super::{View, ViewContext, empty_plot};
use crate::analysis::ablation::{AblationGrid, ablation_grid};
use crate::analysis::figures::recall::{heatmap, layer_head_heatmap};
use crate::analysis::heads::{HeadScores, InductionProbe};
use crate::analysis::reading::{TextReading, induction_scores, read_text, tokenise};
use crate::checkpoint::{self, Pretrained, TextTokenizer};
use crate::figures::QUERY_KEY_AXES;
use crate::model::Ablation;

/// A model folder opened: its model and tokenizer.
pub struct Opened {
    pub folder: PathBuf,
    pub pretrained: Pretrained,
    pub tokenizer: TextTokenizer,
}

impl Opened {
    fn describe(&self) -> String {
        let c = &self.pretrained.model_config;
        format!(
            "{} ({}): {} layers × {} heads, d_model {}, {} tokens, {} positions",
            self.folder.display(),
            self.pretrained.family,
            c.n_layers,
            c.n_heads,
            c.d_model,
            self.pretrained.vocab_size,
            self.pretrained.max_len
        )
    }
}

/// The score a grid shows, per head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Score {
    #[default]
    PreviousToken,
    FirstToken,
    Entropy,
    /// TransformerLens's induction score on the induction probe.
    Induction,
    /// Hard IoU of the probe's second copy against the induction targets.
    InductionIou,
    /// The mean next-token loss change on the text when the head is ablated.
    AblationChange,
}

impl Score {
    const ALL: [Score; 6] = [
        Score::PreviousToken,
        Score::FirstToken,
        Score::Entropy,
        Score::Induction,
        Score::InductionIou,
        Score::AblationChange,
    ];

    fn label(self) -> &'static str {
        match self {
            Score::PreviousToken => "previous token",
            Score::FirstToken => "first token (sink)",
            Score::Entropy => "entropy (nats)",
            Score::Induction => "induction (probe)",
            Score::InductionIou => "induction IoU (probe)",
            Score::AblationChange => "Δ loss when ablated (nats)",
        }
    }

    fn hover(self) -> &'static str {
        match self {
            Score::PreviousToken => "mean weight on the key just before each query, on the text",
            Score::FirstToken => "mean weight on position 0, queries 1 on, on the text",
            Score::Entropy => "mean entropy of the rows, queries 1 on, on the text",
            Score::Induction => {
                "TransformerLens's induction score: weight on the token after the query's \
                 earlier occurrence, on random tokens repeated twice"
            }
            Score::InductionIou => {
                "hard IoU (τ 0.1) of the probe's second copy against the induction targets"
            }
            Score::AblationChange => {
                "mean next-token loss change on the text when the head's output (hook_z) is \
                 zeroed or set to its mean"
            }
        }
    }

    /// The score in exported file names.
    fn slug(self) -> &'static str {
        match self {
            Score::PreviousToken => "previous-token",
            Score::FirstToken => "first-token",
            Score::Entropy => "entropy",
            Score::Induction => "induction",
            Score::InductionIou => "induction-iou",
            Score::AblationChange => "ablation",
        }
    }

    /// Signed scores are drawn on a diverging scale around 0.
    fn signed(self) -> bool {
        self == Score::AblationChange
    }

    fn of_head(self, s: &HeadScores) -> f64 {
        match self {
            Score::PreviousToken => s.previous_token,
            Score::FirstToken => s.first_token,
            Score::Entropy => s.entropy,
            Score::Induction => s.induction,
            Score::InductionIou => s.induction_iou,
            Score::AblationChange => f64::NAN,
        }
    }
}

/// The view's state.
pub struct PretrainedView {
    /// Model folders opened before, newest first (saved with the window).
    pub recent: Vec<PathBuf>,
    opening: Option<Job<Arc<Opened>>>,
    model: Option<Arc<Opened>>,
    text: String,
    /// Put the model's beginning-of-sequence token first, as TransformerLens does.
    first: bool,
    text_dialog: Option<Job<Option<String>>>,
    reading_job: Option<Job<TextReading>>,
    reading: Option<TextReading>,
    probe_job: Option<Job<Vec<HeadScores>>>,
    probe: Option<Vec<HeadScores>>,
    ablation_job: Option<Job<AblationGrid>>,
    ablation: Option<AblationGrid>,
    score: Score,
    /// The head shown on plot axes: (index into the reading's layers, head).
    head: (usize, usize),
    /// Bumped whenever the reading, the probe's scores or the ablation change: the cached
    /// grid is redrawn when it or the score differs.
    version: u64,
    /// The shown layer's head maps as textures and the shown head's map as numbers, made when
    /// the reading, the layer or the head changes (not every frame).
    textures: Option<Textures>,
    /// The score grid's texture, its colours and values, for (score, version).
    grid: Option<(Score, u64, Grid)>,
    error: Option<String>,
}

/// Textures of one reading's layer, and the shown head's map.
struct Textures {
    /// (version, layer index, head).
    key: (u64, usize, usize),
    maps: Vec<egui::TextureHandle>,
    /// The shown head's map as a row-major square, and its colour range.
    values: Vec<f32>,
    scale: ColourScale,
}

/// The score grid as drawn: `[layer][head]` values, flat values, colours and texture.
struct Grid {
    table: Vec<Vec<f64>>,
    values: Vec<f32>,
    scale: ColourScale,
    texture: egui::TextureHandle,
}

/// The sentence a new view reads: the indirect-object sentence of interpretability's classic
/// circuit study, where name-mover and induction heads show.
const FIRST_TEXT: &str = "When Mary and John went to the store, John gave a drink to";

/// Maps at most this many tokens long show each tick's token.
const TOKEN_TICKS: usize = 64;

impl Default for PretrainedView {
    fn default() -> Self {
        Self {
            recent: Vec::new(),
            opening: None,
            model: None,
            text: FIRST_TEXT.into(),
            first: true,
            text_dialog: None,
            reading_job: None,
            reading: None,
            probe_job: None,
            probe: None,
            ablation_job: None,
            ablation: None,
            score: Score::default(),
            head: (0, 0),
            version: 0,
            textures: None,
            grid: None,
            error: None,
        }
    }
}

impl View for PretrainedView {
    fn logic(&mut self, _cx: &ViewContext) {
        if let Some(opened) = take_result(&mut self.opening, &mut self.error, None) {
            self.remember(opened.folder.clone());
            self.model = Some(opened);
            // The old model's work is dropped (cancelled) with its results.
            (self.reading_job, self.probe_job, self.ablation_job) = (None, None, None);
            self.forget_results();
        }
        if let Some(Some(text)) = take_result(&mut self.text_dialog, &mut self.error, None) {
            self.text = text;
        }
        if let Some(reading) = take_result(&mut self.reading_job, &mut self.error, None) {
            self.reading = Some(reading);
            // An ablation of the previous text belongs to it.
            (self.ablation, self.ablation_job) = (None, None);
            self.head = (0, 0);
            self.version += 1;
        }
        let cancelled = Some("the probe was cancelled");
        if let Some(scores) = take_result(&mut self.probe_job, &mut self.error, cancelled) {
            self.probe = Some(scores);
            self.score = Score::Induction;
            self.version += 1;
        }
        let cancelled = Some("the ablation was cancelled");
        if let Some(grid) = take_result(&mut self.ablation_job, &mut self.error, cancelled) {
            self.ablation = Some(grid);
            self.score = Score::AblationChange;
            self.version += 1;
        }
    }

    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        self.model_ui(ui, cx);
        if let Some(error) = &self.error {
            ui.colored_label(ui.visuals().error_fg_color, error);
        }
        let Some(model) = self.model.clone() else {
            empty_plot(
                ui,
                120.0,
                "Open a Hugging Face model folder (gpt2, pythia-70m, TinyStories-33M: \
                 config.json, model.safetensors or pytorch_model.bin, tokenizer.json) to see \
                 its heads on your text. docs/pretrained.md says how to get the weights.",
            );
            return;
        };
        self.text_ui(ui, cx.jobs, &model);
        if self.reading.is_none() {
            return;
        }
        ui.separator();
        self.refresh(ui.ctx());
        ui.columns(2, |columns| {
            self.scores_ui(&mut columns[0], cx.jobs, &model, cx.exporter);
            self.head_ui(&mut columns[1], cx.exporter, &model);
        });
    }

    fn is_busy(&self) -> bool {
        self.opening.is_some()
            || self.reading_job.is_some()
            || self.probe_job.is_some()
            || self.ablation_job.is_some()
    }
}

impl PretrainedView {
    /// Opens the model in `folder` as a job (its reading of the old model is dropped when the
    /// new one arrives).
    pub fn open(&mut self, jobs: &Jobs, folder: PathBuf) {
        self.opening = Some(jobs.spawn("opening the model", move |_, _| {
            let pretrained = checkpoint::open(&folder, &candle_core::Device::Cpu)?;
            let tokenizer = TextTokenizer::open(&folder)?;
            Ok(Some(Arc::new(Opened {
                folder,
                pretrained,
                tokenizer,
            })))
        }));
    }

    fn remember(&mut self, folder: PathBuf) {
        self.recent.retain(|f| f != &folder);
        self.recent.insert(0, folder);
        self.recent.truncate(8);
    }

    fn forget_results(&mut self) {
        self.reading = None;
        self.probe = None;
        self.ablation = None;
        self.version += 1;
    }

    /// The model line: open a folder (or a recent one), and what is open.
    fn model_ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        ui.horizontal_wrapped(|ui| {
            let idle = self.opening.is_none();
            if ui
                .add_enabled(idle, egui::Button::new("Open model folder..."))
                .clicked()
            {
                cx.commands.push(Command::AskOpenModel);
            }
            let mut picked = None;
            for folder in &self.recent {
                let name = folder
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| folder.display().to_string());
                let button = ui.add_enabled(idle, egui::Button::new(name).small());
                if button.on_hover_text(folder.display().to_string()).clicked() {
                    picked = Some(folder.clone());
                }
            }
            if let Some(folder) = picked {
                self.open(cx.jobs, folder);
            }
        });
        match (&self.opening, &self.model) {
            (Some(job), _) => job.ui(ui),
            (None, Some(model)) => {
                ui.label(model.describe());
            }
            (None, None) => {}
        }
    }

    /// The text box, its file dialog, and Read.
    fn text_ui(&mut self, ui: &mut egui::Ui, jobs: &Jobs, model: &Arc<Opened>) {
        let label = ui.label("text");
        ui.add(
            egui::TextEdit::multiline(&mut self.text)
                .desired_rows(3)
                .desired_width(f32::INFINITY),
        )
        .labelled_by(label.id);
        ui.horizontal(|ui| {
            if ui
                .add_enabled(self.text_dialog.is_none(), egui::Button::new("Open text file..."))
                .clicked()
            {
                self.text_dialog = Some(jobs.spawn("text file", |_, _| {
                    let pick = || rfd::FileDialog::new().pick_file();
                    let no_dialog = |_| {
                        crate::Error::Failed(
                            "no file dialog opens here (no desktop portal or zenity): paste \
                             the text into the box instead"
                                .into(),
                        )
                    };
                    let Some(path) = crate::app::prompt::pick_for_field(pick).map_err(no_dialog)?
                    else {
                        return Ok(Some(None));
                    };
                    let text = crate::io::read_text(&path, "text", crate::io::MAX_TEXT_FILE)?;
                    Ok(Some(Some(text)))
                }));
            }
            let has_first = model.pretrained.first_token.is_some();
            ui.add_enabled(
                has_first,
                egui::Checkbox::new(&mut self.first, "beginning-of-sequence token first"),
            )
            .on_hover_text("TransformerLens prepends it; heads often sink their weight on it");
            match &self.reading_job {
                Some(job) => job.ui(ui),
                None => {
                    if ui.button("Read").clicked() {
                        self.read(jobs, model);
                    }
                }
            }
        });
    }

    /// Reads the text as a job (a text the model cannot read ends it with the reason); an
    /// ablation still running belongs to the previous text and is dropped.
    fn read(&mut self, jobs: &Jobs, model: &Arc<Opened>) {
        let (model, text, first) = (model.clone(), self.text.clone(), self.first);
        self.ablation_job = None;
        self.reading_job = Some(jobs.spawn("reading the text", move |_, _| {
            let tokens = tokenise(&model.pretrained, &model.tokenizer, &text, first)?;
            Ok(Some(read_text(&model.pretrained, tokens)?))
        }));
    }

    /// The shown layer's head maps as textures, each on its own colour range, and the shown
    /// head's map; remade only when the reading, the layer or the head changes.
    fn refresh(&mut self, ctx: &egui::Context) {
        let Some(reading) = &self.reading else { return };
        let key = (self.version, self.head.0, self.head.1);
        match &mut self.textures {
            Some(t) if t.key == key => return,
            // Another head of the same layer: its thumbnails stand.
            Some(t) if (t.key.0, t.key.1) == (key.0, key.1) => {
                t.values = square(&reading.attention[key.1][key.2]);
                t.scale = ColourScale::of(&t.values, false);
                t.key = key;
                return;
            }
            _ => {}
        }
        let n = reading.tokens.ids.len();
        let maps = reading.attention[self.head.0]
            .iter()
            .enumerate()
            .map(|(head, map)| {
                let values = square(map);
                let image = ColourScale::of(&values, false).image(&values, n, n);
                let name = format!("pretrained-{}-{head}", self.head.0);
                ctx.load_texture(name, image, egui::TextureOptions::NEAREST)
            })
            .collect();
        let values = square(&reading.attention[key.1][key.2]);
        let scale = ColourScale::of(&values, false);
        self.textures = Some(Textures {
            key,
            maps,
            values,
            scale,
        });
    }

    /// The score grid with its choice of score, the probe and ablation buttons, and the shown
    /// layer's heads.
    fn scores_ui(
        &mut self,
        ui: &mut egui::Ui,
        jobs: &Jobs,
        model: &Arc<Opened>,
        exporter: &Exporter,
    ) {
        let Some(reading) = &self.reading else { return };
        ui.label(reading.tokens.numbered(40));
        let layers = reading.layers.clone();
        // The reading's own head count: the grid and the maps are of its data.
        let heads = reading.attention.first().map_or(0, Vec::len);
        egui::ComboBox::from_label("head score")
            .selected_text(self.score.label())
            .show_ui(ui, |ui| {
                for score in Score::ALL {
                    ui.selectable_value(&mut self.score, score, score.label())
                        .on_hover_text(score.hover());
                }
            });
        self.probe_controls(ui, jobs, model);
        self.ablation_controls(ui, jobs, model);
        self.refresh_grid(ui.ctx(), (layers.len(), heads));
        match &self.grid {
            Some((score, _, grid)) => {
                let score = *score;
                ui.horizontal(|ui| {
                    grid.scale.legend(ui, score.label());
                    let caption = self.caption(model);
                    exporter.buttons(ui, &format!("heads-{}", score.slug()), || {
                        layer_head_heatmap(
                            format!("{}: {}", model.pretrained.family, score.label()),
                            caption,
                            &grid.table,
                            &layers,
                            score.label(),
                        )
                    });
                });
                let shape = (layers.as_slice(), heads);
                if let Some(cell) = grid_image(ui, &grid.texture, shape, &grid.values, score) {
                    self.head = cell;
                    // The maps follow on the next frame.
                    ui.ctx().request_repaint();
                }
            }
            None => {
                ui.label(match self.score {
                    Score::AblationChange => "ablate the heads to see this grid",
                    _ => "run the induction probe to see this grid",
                });
            }
        }
        self.layer_maps_ui(ui, heads);
    }

    /// The chosen score's grid as drawn, made again only when the score or the results change.
    fn refresh_grid(&mut self, ctx: &egui::Context, (layers, heads): (usize, usize)) {
        if self.grid.as_ref().is_some_and(|(s, v, _)| (*s, *v) == (self.score, self.version)) {
            return;
        }
        self.grid = self.table().map(|table| {
            let values: Vec<f32> = table.iter().flatten().map(|&v| v as f32).collect();
            let scale = match self.score.signed() {
                true => ColourScale::signed(&values),
                false => ColourScale::of(&values, false),
            };
            let image = scale.image(&values, layers, heads);
            let texture = ctx.load_texture("pretrained-scores", image, egui::TextureOptions::NEAREST);
            let grid = Grid {
                table,
                values,
                scale,
                texture,
            };
            (self.score, self.version, grid)
        });
    }

    /// The table of the chosen score, `[layer][head]`, if computed.
    fn table(&self) -> Option<Vec<Vec<f64>>> {
        let reading = self.reading.as_ref()?;
        let heads = reading.attention.first().map_or(0, Vec::len);
        let table = |values: Vec<f64>| -> Vec<Vec<f64>> {
            values.chunks(heads.max(1)).map(<[f64]>::to_vec).collect()
        };
        let scores = match self.score {
            Score::AblationChange => {
                let grid = self.ablation.as_ref()?;
                return Some(table(grid.heads.iter().map(|h| h.change).collect()));
            }
            Score::Induction | Score::InductionIou => self.probe.as_ref()?,
            _ => &reading.scores,
        };
        Some(table(scores.iter().map(|s| self.score.of_head(s)).collect()))
    }

    /// What the exported grid says it was computed on.
    fn caption(&self, model: &Opened) -> String {
        let on = match self.score {
            Score::Induction | Score::InductionIou => {
                let probe = probe_for(&model.pretrained);
                format!("on the induction probe ({})", probe.describe())
            }
            Score::AblationChange => match &self.ablation {
                Some(grid) => format!(
                    "{} ablation on the text (clean loss {:.3} nats)",
                    grid.mode.name(),
                    grid.clean_loss
                ),
                None => String::new(),
            },
            _ => "on the text".into(),
        };
        format!("{} {on}", model.folder.display())
    }

    fn probe_controls(&mut self, ui: &mut egui::Ui, jobs: &Jobs, model: &Arc<Opened>) {
        ui.horizontal(|ui| {
            match &self.probe_job {
                Some(job) => job.ui(ui),
                None => {
                    let button = ui
                        .button("Run the induction probe")
                        .on_hover_text(probe_for(&model.pretrained).describe());
                    if button.clicked() {
                        let model = model.clone();
                        self.probe_job = Some(jobs.spawn("induction probe", move |_, _| {
                            let probe = probe_for(&model.pretrained);
                            Ok(Some(induction_scores(&model.pretrained, &probe)?))
                        }));
                    }
                }
            }
        });
    }

    fn ablation_controls(&mut self, ui: &mut egui::Ui, jobs: &Jobs, model: &Arc<Opened>) {
        let Some(reading) = &self.reading else { return };
        ui.horizontal(|ui| {
            if let Some(job) = &self.ablation_job {
                job.ui(ui);
                return;
            }
            ui.label("ablate each head:");
            for mode in [Ablation::Zero, Ablation::Mean] {
                let enough = reading.tokens.ids.len() >= 2;
                let button = ui
                    .add_enabled(enough, egui::Button::new(mode.name()))
                    .on_hover_text("a forward pass per head: the next-token loss change")
                    .on_disabled_hover_text("needs two tokens or more to predict one");
                if !button.clicked() {
                    continue;
                }
                let ids = match reading.ids(&candle_core::Device::Cpu) {
                    Ok(ids) => ids,
                    Err(e) => {
                        self.error = Some(e.to_string());
                        return;
                    }
                };
                let (model, layers) = (model.clone(), reading.layers.clone());
                self.ablation_job = Some(jobs.spawn("ablating heads", move |progress, cancel| {
                    let heads = model.pretrained.model_config.n_heads;
                    let shape = (layers.as_slice(), heads);
                    ablation_grid(&model.pretrained.model, &ids, shape, mode, progress, cancel)
                }));
            }
        });
    }

    /// The shown layer's heads, each clickable to its map.
    fn layer_maps_ui(&mut self, ui: &mut egui::Ui, heads: usize) {
        let Some(reading) = &self.reading else { return };
        let Some(textures) = &self.textures else { return };
        let layer = reading.layers[textures.key.1];
        ui.label(format!("layer {layer}: its heads (click one)"));
        let side = ((ui.available_width() - 8.0) / heads.min(8) as f32).clamp(32.0, 160.0);
        let mut clicked = None;
        ui.horizontal_wrapped(|ui| {
            for (head, texture) in textures.maps.iter().enumerate() {
                let image = egui::Image::new((texture.id(), egui::vec2(side, side)))
                    .sense(egui::Sense::click());
                let response = ui.add(image).on_hover_text(format!("layer {layer} head {head}"));
                if response.clicked() {
                    clicked = Some(head);
                }
            }
        });
        if let Some(head) = clicked {
            self.head = (textures.key.1, head);
            ui.ctx().request_repaint();
        }
    }

    /// The shown head's map on plot axes, its tokens as ticks and on hover, and its export.
    fn head_ui(&self, ui: &mut egui::Ui, exporter: &Exporter, model: &Opened) {
        let (Some(reading), Some(textures)) = (&self.reading, &self.textures) else {
            return;
        };
        // What the textures were made for (the head picked this frame shows on the next).
        let (_, index, head) = textures.key;
        let Some(texture) = textures.maps.get(head) else {
            return;
        };
        let layer = reading.layers[index];
        let tokens = &reading.tokens.tokens;
        let n = tokens.len();
        let values = &textures.values;
        ui.horizontal(|ui| {
            ui.strong(format!("layer {layer} head {head}"));
            exporter.buttons(ui, &format!("pretrained-layer{layer}-head{head}"), || {
                heatmap(
                    format!("{}: attention, layer {layer} head {head}", model.pretrained.family),
                    format!("{} on: {}", model.folder.display(), reading.tokens.numbered(64)),
                    (n, n),
                    values.iter().map(|&v| f64::from(v)).collect(),
                    [QUERY_KEY_AXES[0], QUERY_KEY_AXES[1], "weight"],
                )
            });
        });
        textures.scale.legend(ui, "weight");
        axes_note(ui, QUERY_KEY_AXES);
        let ticks = |mark: GridMark, _: &std::ops::RangeInclusive<f64>| token_tick(mark.value, tokens);
        let hover = |at: &HoverPosition| {
            let (HoverPosition::Elsewhere { position }
            | HoverPosition::NearDataPoint { position, .. }) = at;
            let (i, j) = (position.y.floor(), position.x.floor());
            let inside = (0.0..n as f64).contains(&i) && (0.0..n as f64).contains(&j);
            inside.then(|| cell_text(values, tokens, i as usize, j as usize))
        };
        titled_plot("pretrained-head", QUERY_KEY_AXES)
            .height(ui.available_height().max(240.0))
            .data_aspect(1.0)
            .invert_y(true)
            .show_grid(false)
            .x_axis_formatter(ticks)
            .y_axis_formatter(ticks)
            .label_formatter(hover)
            .show(ui, |plot| {
                let centre = PlotPoint::new(n as f64 / 2.0, n as f64 / 2.0);
                let size = egui::vec2(n as f32, n as f32);
                plot.image(PlotImage::new("head", texture.id(), centre, size));
            });
    }
}

/// The probe the view runs on `model`: TransformerLens's 50 random tokens repeated (fewer where
/// the model's positions are fewer), over 8 sequences, after its first token.
fn probe_for(model: &Pretrained) -> InductionProbe {
    let first = usize::from(model.first_token.is_some());
    InductionProbe {
        rows: 8,
        half: 50.min(model.max_len.saturating_sub(first) / 2).max(1),
        vocab: model.vocab_size,
        first: model.first_token,
        seed: 0,
    }
}


/// A causal map (row q over keys 0..=q) as a row-major square, zeros above the diagonal.
fn square(map: &[Vec<f32>]) -> Vec<f32> {
    let n = map.len();
    let mut values = vec![0.0; n * n];
    for (q, row) in map.iter().enumerate() {
        values[q * n..q * n + row.len()].copy_from_slice(row);
    }
    values
}

/// The layers × heads grid of a score as an image; a click returns the (layer index, head)
/// of the cell clicked, and hovering a cell names its head and value.
fn grid_image(
    ui: &mut egui::Ui,
    texture: &egui::TextureHandle,
    (layers, heads): (&[usize], usize),
    values: &[f32],
    score: Score,
) -> Option<(usize, usize)> {
    let cell = (ui.available_width() / heads as f32).clamp(12.0, 40.0);
    let size = egui::vec2(cell * heads as f32, cell * layers.len() as f32);
    let response = ui.add(egui::Image::new((texture.id(), size)).sense(egui::Sense::click()));
    // The cells as laid out (a justified layout may widen the image).
    let rect = response.rect;
    let cell = egui::vec2(rect.width() / heads as f32, rect.height() / layers.len() as f32);
    let at = |pos: egui::Pos2| {
        let head = (((pos.x - rect.min.x) / cell.x) as usize).min(heads - 1);
        let row = (((pos.y - rect.min.y) / cell.y) as usize).min(layers.len() - 1);
        (row, head)
    };
    let hovered = response.hover_pos().map(at);
    let clicked = response
        .clicked()
        .then(|| response.interact_pointer_pos().map(at))
        .flatten();
    if let Some((row, head)) = hovered {
        let value = values[row * heads + head];
        response.on_hover_text(format!(
            "layer {} head {head}: {} {value:.4} (click for its map)",
            layers[row],
            score.label()
        ));
    }
    clicked
}

/// A tick of a map's axis: whole positions inside the map, with the token there when the
/// text is short enough to read them.
fn token_tick(value: f64, tokens: &[String]) -> String {
    let n = tokens.len();
    if value < 0.0 || value >= n as f64 || value.fract() != 0.0 {
        return String::new();
    }
    let p = value as usize;
    match n <= TOKEN_TICKS {
        true => format!("{p} {:?}", tokens[p]),
        false => p.to_string(),
    }
}

/// What hovering cell (query i, key j) of a head's map says: both tokens and the weight.
fn cell_text(values: &[f32], tokens: &[String], i: usize, j: usize) -> String {
    let n = tokens.len();
    format!(
        "query {i} {:?}, key {j} {:?}: weight {:.4}",
        tokens[i],
        tokens[j],
        values[i * n + j]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_causal_map_squares_with_zeros_above_the_diagonal() {
        let map = vec![vec![1.0], vec![0.25, 0.75]];
        assert_eq!(square(&map), vec![1.0, 0.0, 0.25, 0.75]);
    }

    #[test]
    fn ticks_and_hovers_name_the_tokens() {
        let tokens: Vec<String> = ["<|endoftext|>", "The", " cat"].map(String::from).into();
        assert_eq!(token_tick(2.0, &tokens), "2 \" cat\"");
        assert_eq!(token_tick(2.5, &tokens), "");
        assert_eq!(token_tick(3.0, &tokens), "");
        let values = square(&[vec![1.0], vec![0.5, 0.5], vec![0.2, 0.3, 0.5]]);
        assert_eq!(
            cell_text(&values, &tokens, 2, 1),
            "query 2 \" cat\", key 1 \"The\": weight 0.3000"
        );
        let long: Vec<String> = (0..100).map(|i| i.to_string()).collect();
        assert_eq!(token_tick(7.0, &long), "7");
    }
}
