//! Attention maps of the selected run: layers × heads for one saved example, as textures
//! (uploaded once per evaluation, so maps of 512² and beyond stay cheap), with hover details,
//! a zoomed head, a log colour option and, for MQAR, the ground-truth value positions.

use std::collections::HashMap;

use eframe::egui;
use egui_plot::{GridMark, HoverPosition, PlotImage, PlotPoint, PlotPoints, Polygon};

use super::super::export::Exporter;
use super::super::runs::{LoadedAttention, RunView};
use super::colour::{ColourScale, axes_note, own_range_legend};
use super::super::plot::titled_plot;
use super::{View, ViewContext};
use crate::attention::Mixing;
use crate::figures::{Figure, HeatmapPlot, Plot, QUERY_KEY_AXES};

/// What a map's colours are: weights, or a signed mixing matrix's entries.
fn weight_label(signed: bool) -> &'static str {
    match signed {
        true => "A_ij (signed)",
        false => "weight",
    }
}

/// What the textures were made from; a change re-uploads them.
#[derive(Clone, PartialEq)]
struct Key {
    run: String,
    version: u64,
    example: usize,
    log: bool,
    shared: bool,
    /// The run's mechanism mixes with a signed matrix (diverging colours around 0).
    signed: bool,
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
    /// The example's tokens as its task spells them ('a' for a language model's byte, not 97).
    tokens: Vec<String>,
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
            let signed = run.preset.attention.mixing() == Mixing::Signed;
            ui.add_enabled(!signed, egui::Checkbox::new(&mut self.log, "log colour"))
                .on_disabled_hover_text(
                    "a signed matrix (retention): diverging colours around 0, blue < 0 < red",
                );
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
            signed: run.preset.attention.mixing() == Mixing::Signed,
        };
        if self.key.as_ref() == Some(&key) {
            return;
        }
        self.textures.clear();
        let (example, log, signed) = (self.example, self.log, key.signed);
        let maps: Vec<((usize, usize), &[f32], ColourScale)> = attention
            .layers
            .iter()
            .enumerate()
            .flat_map(|(index, layer)| {
                (0..layer.shape[1]).map(move |head| {
                    let values = layer.matrix(example, head);
                    let scale = match signed {
                        true => ColourScale::signed(values),
                        false => ColourScale::of(values, log),
                    };
                    ((index, head), values, scale)
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
        self.tokens = attention
            .index
            .examples
            .get(self.example)
            .map(|e| {
                let characters = run.characters.as_deref();
                let label = |&t: &u32| run.preset.task.token_label(t, characters);
                e.inputs.iter().map(label).collect()
            })
            .unwrap_or_default();
        self.key = Some(key);
    }

    /// The example's token labels, if it has tokens.
    fn tokens(&self) -> Option<&[String]> {
        (!self.tokens.is_empty()).then_some(self.tokens.as_slice())
    }

    fn grid_ui(&mut self, ui: &mut egui::Ui, attention: &LoadedAttention, heads: usize) {
        let signed = self.key.as_ref().is_some_and(|k| k.signed);
        match self.textures.values().next() {
            Some((_, scale)) if self.shared => scale.legend(ui, weight_label(signed)),
            _ => own_range_legend(ui, weight_label(signed), signed),
        }
        axes_note(ui, QUERY_KEY_AXES);
        let side = ((ui.available_width() - 40.0) / heads as f32).clamp(64.0, 320.0);
        egui::ScrollArea::vertical().show(ui, |ui| {
            for (index, layer) in attention.layers.iter().enumerate() {
                ui.label(format!("layer {}", layer.layer));
                ui.horizontal(|ui| {
                    for head in 0..heads {
                        ui.vertical(|ui| {
                            ui.small(format!("head {head}"));
                            let response = self.head_image(ui, attention, index, head, side);
                            if response.clicked() {
                                self.zoom = Some((index, head));
                            }
                        });
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
        let signed = self.key.as_ref().is_some_and(|k| k.signed);
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
                            value_label: weight_label(signed).into(),
                            log_colour: self.log && !signed,
                            signed,
                        }),
                    }
                },
            );
        });
        if let Some((_, scale)) = self.textures.get(&(index, head)) {
            scale.legend(ui, weight_label(signed));
        }
        self.zoomed_plot(ui, attention, index, head);
    }

    /// The zoomed map on plot axes: titled, ticked by position (with the token at each tick
    /// where the map is short enough to read them), the cell under the pointer on hover, and
    /// the MQAR ground truth boxed.
    fn zoomed_plot(
        &self,
        ui: &mut egui::Ui,
        attention: &LoadedAttention,
        index: usize,
        head: usize,
    ) {
        let Some((texture, _)) = self.textures.get(&(index, head)) else {
            return;
        };
        let layer = &attention.layers[index];
        let [_, _, tq, tk] = layer.shape;
        let weights = layer.matrix(self.example, head);
        let example = attention.index.examples.get(self.example);
        let tokens = self.tokens();
        let ticks = move |n: usize| {
            move |mark: GridMark, _: &std::ops::RangeInclusive<f64>| {
                position_tick(mark.value, n, tokens)
            }
        };
        let hover = move |at: &HoverPosition| {
            let (HoverPosition::Elsewhere { position }
            | HoverPosition::NearDataPoint { position, .. }) = at;
            let (i, j) = (position.y.floor(), position.x.floor());
            let inside = (0.0..tq as f64).contains(&i) && (0.0..tk as f64).contains(&j);
            inside.then(|| cell_text(weights, tk, tokens, i as usize, j as usize))
        };
        titled_plot("attention-zoom", QUERY_KEY_AXES)
            .height(ui.available_height().max(200.0))
            .data_aspect(1.0)
            .invert_y(true)
            .show_grid(false)
            .x_axis_formatter(ticks(tk))
            .y_axis_formatter(ticks(tq))
            .label_formatter(hover)
            .show(ui, |plot| {
                let centre = PlotPoint::new(tk as f64 / 2.0, tq as f64 / 2.0);
                let size = egui::vec2(tk as f32, tq as f32);
                plot.image(PlotImage::new("attention", texture.id(), centre, size));
                for (i, j) in example.into_iter().flat_map(truth_cells) {
                    plot.polygon(truth_box(i, j));
                }
            });
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
        let example = attention.index.examples.get(self.example);
        let stroke = egui::Stroke::new(1.0, TRUTH);
        for (i, j) in example.into_iter().flat_map(truth_cells) {
            let min = rect.min + egui::vec2(j as f32 * cell.x, i as f32 * cell.y);
            let target = egui::Rect::from_min_size(min, cell).expand(1.0);
            ui.painter()
                .rect_stroke(target, 0.0, stroke, egui::StrokeKind::Outside);
        }
        let hover = response.hover_pos().map(|pos| {
            let j = (((pos.x - rect.min.x) / cell.x) as usize).min(tk - 1);
            let i = (((pos.y - rect.min.y) / cell.y) as usize).min(tq - 1);
            cell_text(layer.matrix(self.example, head), tk, self.tokens(), i, j)
        });
        match hover {
            Some(text) => response.on_hover_text(text),
            None => response,
        }
    }
}

/// The colour the MQAR ground truth is outlined in.
const TRUTH: egui::Color32 = egui::Color32::from_rgb(255, 80, 80);

/// Maps at most this many positions long show each tick's token beside its position.
const TOKEN_TICKS: usize = 64;

/// A tick of a map's axis: whole positions inside the map, with the token there when the
/// map is short enough.
fn position_tick(value: f64, n: usize, tokens: Option<&[String]>) -> String {
    if value < 0.0 || value >= n as f64 || value.fract() != 0.0 {
        return String::new();
    }
    let p = value as usize;
    match tokens.filter(|_| n <= TOKEN_TICKS).and_then(|t| t.get(p)) {
        Some(token) => format!("{p}: {token}"),
        None => p.to_string(),
    }
}

/// What hovering cell (query i, key j) of a map says.
fn cell_text(weights: &[f32], tk: usize, tokens: Option<&[String]>, i: usize, j: usize) -> String {
    let token = |p: usize| tokens.and_then(|t| t.get(p)).map_or("?", String::as_str);
    let tokens = if tokens.is_some() {
        format!(", tokens {} -> {}", token(i), token(j))
    } else {
        String::new()
    };
    format!(
        "query {i}, key {j}{tokens}: weight {:.4}",
        weights[i * tk + j]
    )
}

/// The (query, key) cells of an MQAR example's ground truth: each query's value positions.
fn truth_cells(example: &crate::train::run_dir::AttentionExample) -> Vec<(usize, usize)> {
    example
        .queries
        .iter()
        .flat_map(|q| q.value_positions.iter().map(move |&v| (q.position, v)))
        .collect()
}

/// An outline around cell (query i, key j), in plot coordinates.
fn truth_box(i: usize, j: usize) -> Polygon<'static> {
    let (x, y) = (j as f64, i as f64);
    let corners = vec![[x, y], [x + 1.0, y], [x + 1.0, y + 1.0], [x, y + 1.0]];
    Polygon::new("ground truth", PlotPoints::from(corners))
        .fill_color(egui::Color32::TRANSPARENT)
        .stroke(egui::Stroke::new(1.5, TRUTH))
        .allow_hover(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_whole_positions_with_their_token_on_short_maps() {
        let tokens = ["7", "9", "11"].map(String::from);
        assert_eq!(position_tick(1.0, 3, Some(&tokens)), "1: 9");
        assert_eq!(position_tick(1.0, 100, Some(&tokens)), "1");
        assert_eq!(position_tick(1.0, 3, None), "1");
        for off in [-1.0, 0.5, 3.0] {
            assert_eq!(position_tick(off, 3, Some(&tokens)), "");
        }
    }

    #[test]
    fn a_cell_names_its_query_key_tokens_and_weight() {
        let weights = [1.0, 0.0, 0.25, 0.75];
        let tokens = ["'a'", "'b'"].map(String::from);
        let text = cell_text(&weights, 2, Some(&tokens), 1, 0);
        assert_eq!(text, "query 1, key 0, tokens 'b' -> 'a': weight 0.2500");
        assert_eq!(
            cell_text(&weights, 2, None, 0, 1),
            "query 0, key 1: weight 0.0000"
        );
    }
}
