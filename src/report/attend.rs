//! `attnlab attend`'s report: a pretrained model's attention on a text, every layer and head,
//! with the tokens beside the weights.

use std::path::PathBuf;

use serde::Serialize;

use super::Report;
use super::table::csv_field;
use crate::analysis::figures::recall::heatmap;
use crate::analysis::heads::HeadScores;
use crate::checkpoint::Tokens;
use crate::figures::Figure;

/// One head's row-normalised weights, `[query][key]` over keys 0..=query.
pub type HeadMap = Vec<Vec<f32>>;

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
}

impl AttendReport {
    /// The tokens numbered, `0 'The' 1 ' cat' …`, for captions and the text report.
    fn numbered_tokens(&self) -> String {
        let tokens = self.tokens.tokens.iter().enumerate();
        let numbered: Vec<String> = tokens.map(|(i, t)| format!("{i} {t:?}")).collect();
        numbered.join("  ")
    }
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
            self.numbered_tokens(),
            "layer head  previous  first  entropy (nats)  look-back (tokens)".into(),
        ];
        lines.extend(self.scores.iter().map(|s| {
            format!(
                "{:>5} {:>4}  {:>8.4}  {:>5.3}  {:>14.3}  {:>18.2}",
                s.layer,
                s.head,
                s.previous_token,
                s.first_token,
                s.entropy,
                self.look_back(s.layer, s.head)
            )
        }));
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
            format!("tokens: {}", self.numbered_tokens()),
            (n, n),
            values,
            ["key token", "query token", "weight"],
        );
        vec![(String::new(), figure)]
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
    /// The head's mean look-back in tokens, Σ_k w_qk (q − k) averaged over queries 1 on: 1 for
    /// a previous-token head, about q for one on the first token.
    fn look_back(&self, layer: usize, head: usize) -> f64 {
        let map = &self.attention[layer][head];
        let distance = |(q, row): (usize, &Vec<f32>)| {
            let weighted = row
                .iter()
                .enumerate()
                .map(|(k, &w)| w as f64 * (q - k) as f64);
            weighted.sum::<f64>()
        };
        let total: f64 = map.iter().enumerate().skip(1).map(distance).sum();
        total / map.len().saturating_sub(1).max(1) as f64
    }
}
