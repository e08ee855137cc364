//! Attention maps of the selected run: layers × heads for one saved example, as textures
//! (uploaded once per evaluation, so maps of 512² and beyond stay cheap), with hover details,
//! a zoomed head, a log colour option and, for MQAR, the ground-truth value positions.

use std::collections::HashMap;

use eframe::egui;

use super::super::export::Exporter;
use super::super::runs::{LoadedAttention, RunView};
use super::colour::{ColourScale, axes_note};
use super::{View, ViewContext};
use crate::figures::{Figure, HeatmapPlot, Plot, QUERY_KEY_AXES};

/// What the textures were made from; a change re-uploads them.
#[derive(Clone, PartialEq)]
struct Key {
    run: String,
    version: u64,
    example: usize,
    log: bool,
    shared: bool,
}

#[derive(Default)]
pub struct AttentionView {
    example: usize,
    log: bool,
    /// One colour scale for every map (compare heads), instead of each map's own range (see
    /// each head's structure).
    shared: bool,
    zoom: Option<(usize, usize)>,
    key: Option<Key>,
    textures: HashMap<(usize, usize), (egui::TextureHandle, ColourScale)>,
}

impl View for AttentionView {
    fn ui(&mut self, ui: &mut egui::Ui, cx: &ViewContext) {
        let exporter = cx.exporter;
        let Some((run, attention)) = cx
            .runs
            .selected()
            .and_then(|r| r.attention.as_ref().map(|a| (r, a)))
        else {
            ui.label("No attention yet: it is saved at every evaluation of a run.");
            return;
        };
        let Some(first) = attention.layers.first() else {
            return;
        };
        let [examples, heads, _, _] = first.shape;
        ui.horizontal(|ui| {
            ui.label(format!("step {}", attention.index.step));
            ui.add(
                egui::Slider::new(&mut self.example, 0..=examples.saturating_sub(1))
                    .text("example"),
            );
            ui.checkbox(&mut self.log, "log colour");
            ui.checkbox(&mut self.shared, "one scale for all maps")
                .on_hover_text(
                    "off: each map spans its own range (zoom into a map for its colour bar)",
                );
            if self.zoom.is_some() && ui.button("all heads").clicked() {
                self.zoom = None;
            }
        });
        self.example = self.example.min(examples.saturating_sub(1));
        self.refresh(ui.ctx(), run, attention);
        match self.zoom {
            Some((layer, head)) => self.zoomed_ui(ui, attention, layer, head, exporter, run),
            None => self.grid_ui(ui, attention, heads),
        }
    }
}

impl AttentionView {
    fn refresh(&mut self, ctx: &egui::Context, run: &RunView, attention: &LoadedAttention) {
        let key = Key {
            run: run
                .dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            version: run.attention_version,
            example: self.example,
            log: self.log,
            shared: self.shared,
        };
        if self.key.as_ref() == Some(&key) {
            return;
        }
        self.textures.clear();
        let (example, log) = (self.example, self.log);
        let maps: Vec<((usize, usize), &[f32], ColourScale)> = attention
            .layers
            .iter()
            .enumerate()
            .flat_map(|(index, layer)| {
                (0..layer.shape[1]).map(move |head| {
                    let values = layer.matrix(example, head);
                    ((index, head), values, ColourScale::of(values, log))
                })
            })
            .collect();
        let shared = maps
            .iter()
            .map(|(_, _, scale)| *scale)
            .reduce(ColourScale::union);
        for ((index, head), values, own) in maps {
            let scale = if self.shared {
                shared.unwrap_or(own)
            } else {
                own
            };
            let [_, _, tq, tk] = attention.layers[index].shape;
            let name = format!("attention-{index}-{head}");
            let image = scale.image(values, tq, tk);
            let texture = ctx.load_texture(name, image, egui::TextureOptions::NEAREST);
            self.textures.insert((index, head), (texture, scale));
        }
        self.key = Some(key);
    }

    fn grid_ui(&mut self, ui: &mut egui::Ui, attention: &LoadedAttention, heads: usize) {
        match self.textures.values().next() {
            Some((_, scale)) if self.shared => scale.legend(ui, "weight"),
            _ => {
                ui.label(
                    egui::RichText::new("each map spans its own range; click one to zoom")
                        .small()
                        .weak(),
                );
            }
        }
        axes_note(ui, QUERY_KEY_AXES);
        let side = ((ui.available_width() - 40.0) / heads as f32).clamp(64.0, 320.0);
        egui::ScrollArea::vertical().show(ui, |ui| {
            for (index, layer) in attention.layers.iter().enumerate() {
                ui.label(format!("layer {}", layer.layer));
                ui.horizontal(|ui| {
                    for head in 0..heads {
                        let response = self.head_image(ui, attention, index, head, side);
                        if response.clicked() {
                            self.zoom = Some((index, head));
                        }
                    }
                });
            }
        });
    }

    fn zoomed_ui(
        &mut self,
        ui: &mut egui::Ui,
        attention: &LoadedAttention,
        index: usize,
        head: usize,
        exporter: &Exporter,
        run: &RunView,
    ) {
        let layer = &attention.layers[index];
        ui.horizontal(|ui| {
            ui.strong(format!("layer {} head {head}", layer.layer));
            exporter.buttons(
                ui,
                &format!("attention-layer{}-head{head}", layer.layer),
                || {
                    let [_, _, tq, tk] = layer.shape;
                    Figure {
                        title: format!(
                            "{}: attention, layer {} head {head}",
                            run.name, layer.layer
                        ),
                        caption: Some(format!(
                            "example {} at step {}",
                            self.example, attention.index.step
                        )),
                        plot: Plot::Heatmap(HeatmapPlot {
                            rows: tq,
                            cols: tk,
                            values: layer
                                .matrix(self.example, head)
                                .iter()
                                .map(|&v| f64::from(v))
                                .collect(),
                            x_label: QUERY_KEY_AXES[0].into(),
                            y_label: QUERY_KEY_AXES[1].into(),
                            value_label: "weight".into(),
                            log_colour: self.log,
                        }),
                    }
                },
            );
        });
        if let Some((_, scale)) = self.textures.get(&(index, head)) {
            scale.legend(ui, "weight");
        }
        axes_note(ui, QUERY_KEY_AXES);
        let side = ui
            .available_width()
            .min(ui.available_height() - 30.0)
            .max(128.0);
        self.head_image(ui, attention, index, head, side);
    }

    /// One head's map with hover details and the MQAR ground truth drawn on top.
    fn head_image(
        &self,
        ui: &mut egui::Ui,
        attention: &LoadedAttention,
        index: usize,
        head: usize,
        side: f32,
    ) -> egui::Response {
        let Some((texture, _)) = self.textures.get(&(index, head)) else {
            return ui.label("…");
        };
        let layer = &attention.layers[index];
        let [_, _, tq, tk] = layer.shape;
        let size = egui::vec2(side, side * tq as f32 / tk.max(1) as f32);
        let response = ui.add(egui::Image::new((texture.id(), size)).sense(egui::Sense::click()));
        let rect = response.rect;
        let cell = egui::vec2(rect.width() / tk as f32, rect.height() / tq as f32);
        if let Some(example) = attention.index.examples.get(self.example) {
            let stroke = egui::Stroke::new(1.0, egui::Color32::from_rgb(255, 80, 80));
            for query in &example.queries {
                for &value in &query.value_positions {
                    let min = rect.min
                        + egui::vec2(value as f32 * cell.x, query.position as f32 * cell.y);
                    let target = egui::Rect::from_min_size(min, cell).expand(1.0);
                    ui.painter()
                        .rect_stroke(target, 0.0, stroke, egui::StrokeKind::Outside);
                }
            }
        }
        let hover = response.hover_pos().map(|pos| {
            let j = (((pos.x - rect.min.x) / cell.x) as usize).min(tk - 1);
            let i = (((pos.y - rect.min.y) / cell.y) as usize).min(tq - 1);
            let weight = layer.matrix(self.example, head)[i * tk + j];
            let tokens = attention
                .index
                .examples
                .get(self.example)
                .map_or(String::new(), |e| {
                    format!(
                        ", tokens {} -> {}",
                        e.inputs.get(i).copied().unwrap_or(0),
                        e.inputs.get(j).copied().unwrap_or(0)
                    )
                });
            format!("query {i}, key {j}{tokens}: weight {weight:.4}")
        });
        match hover {
            Some(text) => response.on_hover_text(text),
            None => response,
        }
    }
}
