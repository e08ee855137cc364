//! `attnlab heads`: TransformerLens's per-head diagnostics of a pretrained model
//! ([`crate::analysis::heads`]), a line per head and a layers × heads heatmap per score.

use std::path::PathBuf;

use serde::Serialize;

use super::Report;
use crate::analysis::figures::recall::layer_head_heatmap;
use crate::analysis::heads::{HeadScores, InductionProbe};
use crate::figures::Figure;

/// The scores of every head of one model.
#[derive(Clone, Debug, Serialize)]
pub struct HeadsReport {
    pub model: PathBuf,
    pub family: String,
    pub probe: InductionProbe,
    pub probe_text: String,
    pub layers: usize,
    pub heads: usize,
    pub scores: Vec<HeadScores>,
}

/// One score of a head.
type Score = fn(&HeadScores) -> f64;

/// Each score's name, as the figures' file suffixes say it, and its value.
const SCORES: [(&str, Score); 6] = [
    ("induction", |s| s.induction),
    ("induction-iou", |s| s.induction_iou),
    ("induction-soft-iou", |s| s.induction_soft_iou),
    ("previous-token", |s| s.previous_token),
    ("first-token", |s| s.first_token),
    ("entropy", |s| s.entropy),
];

impl HeadsReport {
    /// The heads ranked by induction score, best first.
    fn by_induction(&self) -> Vec<&HeadScores> {
        let mut ranked: Vec<&HeadScores> = self.scores.iter().collect();
        ranked.sort_by(|a, b| b.induction.total_cmp(&a.induction));
        ranked
    }

    /// Score `value` as a `[layer][head]` table.
    fn table(&self, value: Score) -> Vec<Vec<f64>> {
        let mut table = vec![vec![f64::NAN; self.heads]; self.layers];
        for s in &self.scores {
            table[s.layer][s.head] = value(s);
        }
        table
    }
}

impl Report for HeadsReport {
    fn text(&self) -> Vec<String> {
        let mut lines = vec![
            format!("{} ({})", self.model.display(), self.family),
            self.probe_text.clone(),
            SCORES
                .iter()
                .fold("layer head".to_string(), |line, (name, _)| {
                    line + &format!(" {name:>18}")
                }),
        ];
        lines.extend(self.scores.iter().map(|s| {
            let values = SCORES
                .iter()
                .map(|(_, value)| format!(" {:>18.4}", value(s)));
            format!("{:>5} {:>4}{}", s.layer, s.head, values.collect::<String>())
        }));
        lines.push("entropy in nats; IoU: threshold τ 0.1, soft: Σmin/Σmax".into());
        let top: Vec<String> = self
            .by_induction()
            .iter()
            .take(5)
            .map(|s| format!("{}.{} ({:.3})", s.layer, s.head, s.induction))
            .collect();
        lines.push(format!(
            "strongest induction heads (layer.head): {}",
            top.join(", ")
        ));
        lines
    }

    /// The induction heatmap, and the others as `NAME-induction-iou`, `NAME-induction-soft-iou`,
    /// `NAME-previous-token`, `NAME-first-token`, `NAME-entropy`.
    fn figures(&self) -> Vec<(String, Figure)> {
        let layers: Vec<usize> = (0..self.layers).collect();
        SCORES
            .iter()
            .enumerate()
            .map(|(i, (name, value))| {
                let suffix = if i == 0 {
                    String::new()
                } else {
                    name.to_string()
                };
                let figure = layer_head_heatmap(
                    format!("{name} score: {}", self.family),
                    self.probe_text.clone(),
                    &self.table(*value),
                    &layers,
                    &format!("{name} score"),
                );
                (suffix, figure)
            })
            .collect()
    }

    fn csv(&self) -> String {
        let names = SCORES.map(|(name, _)| name.replace('-', "_"));
        let mut csv = format!("layer,head,{}\n", names.join(","));
        for s in &self.scores {
            let values = SCORES.map(|(_, value)| value(s).to_string());
            csv.push_str(&format!("{},{},{}\n", s.layer, s.head, values.join(",")));
        }
        csv
    }
}
