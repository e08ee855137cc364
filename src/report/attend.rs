//! `attnlab attend`'s report: a pretrained model's attention on a text, every layer and head,
//! with the tokens beside the weights.

use std::path::PathBuf;

use serde::Serialize;

use super::Report;
use super::table::csv_field;
use crate::analysis::ablation::AblationGrid;
use crate::analysis::figures::recall::{heatmap, layer_head_heatmap};
use crate::analysis::heads::HeadScores;
use crate::analysis::reading::HeadMap;
use crate::checkpoint::Tokens;
use crate::figures::{Figure, Plot};

/// Tokens a figure's caption lists (the JSON and CSV have them all).
const CAPTION_TOKENS: usize = 64;

#[derive(Debug, Serialize)]
pub struct AttendReport {
    pub model: PathBuf,
    pub family: String,
    pub tokens: Tokens,
    /// Previous-token, first-token and entropy scores of each head on the text.
    pub scores: Vec<HeadScores>,
    /// `[layer][head]`: each head's map.
    pub attention: Vec<Vec<HeadMap>>,
    /// The head the figure draws, (layer, head).
    pub shown: (usize, usize),
    /// The loss change when each head is ablated, where asked.
    pub ablation: Option<AblationGrid>,
}

impl Report for AttendReport {
    fn text(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "{} ({}): {} tokens",
                self.model.display(),
                self.family,
                self.tokens.ids.len()
            ),
            self.tokens.numbered(usize::MAX),
            "layer head  previous  first  entropy (nats)  look-back (tokens)  Δ loss (nats)".into(),
        ];
        lines.extend(self.scores.iter().map(|s| {
            let change = self.loss_change(s.layer, s.head);
            let change = change.map_or("-".into(), |c| format!("{c:+.4}"));
            format!(
                "{:>5} {:>4}  {:>8.4}  {:>5.3}  {:>14.3}  {:>18.2}  {change:>13}",
                s.layer,
                s.head,
                s.previous_token,
                s.first_token,
                s.entropy,
                self.look_back(s.layer, s.head)
            )
        }));
        if let Some(grid) = &self.ablation {
            let mut ranked: Vec<_> = grid.heads.iter().collect();
            ranked.sort_by(|a, b| b.change.total_cmp(&a.change));
            let top: Vec<String> = ranked
                .iter()
                .take(5)
                .map(|h| format!("{}.{} ({:+.3})", h.layer, h.head, h.change))
                .collect();
            lines.push(format!(
                "clean loss {:.4} nats a token over {} predictions; Δ loss: {}-ablated head \
                 minus clean; largest (layer.head): {}",
                grid.clean_loss,
                grid.clean.len(),
                grid.mode.name(),
                top.join(", ")
            ));
        }
        lines
    }

    /// The shown head's map, tokens in the caption.
    fn figures(&self) -> Vec<(String, Figure)> {
        let (layer, head) = self.shown;
        let Some(map) = self.attention.get(layer).and_then(|l| l.get(head)) else {
            return Vec::new();
        };
        let n = map.len();
        let values = map
            .iter()
            .flat_map(|row| (0..n).map(|k| row.get(k).map_or(f64::NAN, |&w| w as f64)))
            .collect();
        let figure = heatmap(
            format!("attention of layer {layer}, head {head}: {}", self.family),
            format!("tokens: {}", self.tokens.numbered(CAPTION_TOKENS)),
            (n, n),
            values,
            ["key token", "query token", "weight"],
        );
        let mut figures = vec![(String::new(), figure)];
        figures.extend(self.ablation_figure());
        figures
    }

    /// Tidy: one row per layer, head, query and key at or before it, with both tokens.
    fn csv(&self) -> String {
        let mut csv = String::from("layer,head,query,key,query_token,key_token,weight\n");
        let token = |i: usize| csv_field(&self.tokens.tokens[i]);
        for (layer, heads) in self.attention.iter().enumerate() {
            for (head, map) in heads.iter().enumerate() {
                for (q, row) in map.iter().enumerate() {
                    for (k, w) in row.iter().enumerate() {
                        let (tq, tk) = (token(q), token(k));
                        csv.push_str(&format!("{layer},{head},{q},{k},{tq},{tk},{w}\n"));
                    }
                }
            }
        }
        csv
    }
}

impl AttendReport {
    /// The mean loss change when head (layer, head) is ablated, where the report has them.
    fn loss_change(&self, layer: usize, head: usize) -> Option<f64> {
        let grid = self.ablation.as_ref()?;
        let found = grid
            .heads
            .iter()
            .find(|h| (h.layer, h.head) == (layer, head));
        found.map(|h| h.change)
    }

    /// The layers × heads grid of loss changes, as `NAME-ablation`, on the diverging scale
    /// (an ablation may lower the loss).
    fn ablation_figure(&self) -> Option<(String, Figure)> {
        let grid = self.ablation.as_ref()?;
        let layers: Vec<usize> = (0..self.attention.len()).collect();
        let heads = self.attention.first().map_or(0, Vec::len);
        let mut table = vec![vec![f64::NAN; heads]; layers.len()];
        for h in &grid.heads {
            table[h.layer][h.head] = h.change;
        }
        let mut figure = layer_head_heatmap(
            format!(
                "loss change when a head is {}-ablated: {}",
                grid.mode.name(),
                self.family
            ),
            format!(
                "mean over {} predicted tokens, clean loss {:.3} nats",
                grid.clean.len(),
                grid.clean_loss
            ),
            &table,
            &layers,
            "Δ loss (nats)",
        );
        if let Plot::Heatmap(plot) = &mut figure.plot {
            plot.signed = true;
        }
        Some(("ablation".into(), figure))
    }

    /// The head's mean look-back in tokens ([`look_back`]).
    fn look_back(&self, layer: usize, head: usize) -> f64 {
        look_back(&self.attention[layer][head])
    }
}

/// Σ_k w_qk (q − k) averaged over queries 1 on: 1 for a previous-token head, q/2 on average
/// for one on the first token; NaN for a map of one token.
fn look_back(map: &[Vec<f32>]) -> f64 {
    if map.len() < 2 {
        return f64::NAN;
    }
    let distance = |(q, row): (usize, &Vec<f32>)| {
        let weighted = row
            .iter()
            .enumerate()
            .map(|(k, &w)| w as f64 * (q - k) as f64);
        weighted.sum::<f64>()
    };
    let total: f64 = map.iter().enumerate().skip(1).map(distance).sum();
    total / (map.len() - 1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A previous-token head looks back 1; a head on the first token looks back q from query
    /// q, (1 + 2 + 3)/3 = 2 over four tokens; one token has nothing to look back at.
    #[test]
    fn look_back_is_the_mean_distance_read() {
        let one_hot = |key: fn(usize) -> usize| -> Vec<Vec<f32>> {
            (0..4)
                .map(|q| {
                    (0..=q)
                        .map(|k| if k == key(q) { 1.0 } else { 0.0 })
                        .collect()
                })
                .collect()
        };
        assert_eq!(look_back(&one_hot(|q| q.saturating_sub(1))), 1.0);
        assert_eq!(look_back(&one_hot(|_| 0)), 2.0);
        assert!(look_back(&[vec![1.0]]).is_nan());
    }
}
