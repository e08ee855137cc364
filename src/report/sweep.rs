//! The report of a sweep (the ReBased paper's Figure 1): the best learning rate per mechanism,
//! length and width, and one accuracy-vs-d_model figure per length; for runs of MAD's probes,
//! MAD's score per mechanism and task.

use std::path::{Path, PathBuf};

use serde::Serialize;

use serde_json::json;

use super::{Report, Table, with_suffix};
use crate::figures::{self, Figure};
use crate::sweep::SweepSummary;
use crate::sweep::figures::{accuracy_panels, frontier_panels, mad_figure};
use crate::{Error, Result};

/// `attnlab sweep`, `sweep collect` and the Sweep view: the summary of a sweep's finished runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct SweepReport {
    pub summary: SweepSummary,
}

impl SweepReport {
    /// Writes `summary.json` and each panel as `accuracy-L<len>-N<pairs>.svg` and `.csv` into
    /// `dir`, where a sweep keeps its runs; returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create folder", dir, e))?;
        let mut written = vec![dir.join("summary.json")];
        crate::io::write_json(&written[0], self)?;
        for (suffix, figure) in self.figures() {
            for ext in ["svg", "csv"] {
                let path = with_suffix(&dir.join(format!("accuracy.{ext}")), &suffix);
                figures::save(&figure, &path)?;
                written.push(path);
            }
        }
        Ok(written)
    }
}

impl Report for SweepReport {
    /// The best-lr table, then MAD's scores where there are any.
    fn text(&self) -> Vec<String> {
        let (points, mad) = (&self.summary.points, &self.summary.mad);
        let mut lines = match points.is_empty() && !mad.is_empty() {
            true => Vec::new(),
            false => self.table().text(),
        };
        if !mad.is_empty() {
            if !lines.is_empty() {
                lines.push(String::new());
            }
            lines.extend(self.mad_table().text());
        }
        lines
    }

    /// One accuracy panel per (length, pairs) as `NAME-L<len>-N<pairs>` (no panel stands for
    /// the sweep), then the recall-vs-state frontier of each as `NAME-frontier-L<len>-N<pairs>`.
    fn figures(&self) -> Vec<(String, Figure)> {
        let accuracy = accuracy_panels(&self.summary)
            .into_iter()
            .map(|((seq_len, pairs), figure)| (format!("L{seq_len}-N{pairs}"), figure));
        let frontier = frontier_panels(&self.summary)
            .into_iter()
            .map(|((seq_len, pairs), figure)| (format!("frontier-L{seq_len}-N{pairs}"), figure));
        let mad = mad_figure(&self.summary).map(|figure| ("mad".to_string(), figure));
        accuracy.chain(frontier).chain(mad).collect()
    }

    fn csv(&self) -> String {
        self.table().csv()
    }
}

impl SweepReport {
    /// MAD's score per mechanism and task, with the published score beside it where there is
    /// one, the runs it rests on (a setting's fewest below MAD's six: a lower bound) and their
    /// epoch scale.
    fn mad_table(&self) -> Table {
        let mut table = Table::new(&[
            "mechanism",
            "mad_task",
            "score",
            "published",
            "settings",
            "runs",
            "fewest_runs",
            "epoch_scale",
            "macro",
        ]);
        for s in &self.summary.mad {
            let published = crate::sweep::mad::published(&s.mechanism, &s.probe);
            table.push(vec![
                json!(s.mechanism),
                json!(s.probe),
                json!(s.score),
                json!(published.map(|(model, score)| format!("{score:.3} ({model})"))),
                json!(s.settings),
                json!(s.runs),
                json!(s.fewest_runs),
                json!(s.epoch_scale),
                json!(s.macro_metric),
            ]);
        }
        table
    }

    /// One row per point: its cell, best lr, the mean and spread over seeds there, and the
    /// model's recurrent state.
    fn table(&self) -> Table {
        let mut table = Table::new(&[
            "mechanism",
            "seq_len",
            "num_kv_pairs",
            "d_model",
            "best_lr",
            "mean",
            "std",
            "seeds",
            "state_zoology",
        ]);
        for p in &self.summary.points {
            table.push(vec![
                json!(p.mechanism),
                json!(p.seq_len),
                json!(p.num_kv_pairs),
                json!(p.d_model),
                json!(p.best_lr),
                json!(p.mean),
                json!(p.std),
                json!(p.seeds),
                json!(p.state_zoology),
            ]);
        }
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Format, render};
    use crate::sweep::{CellResult, summarise};

    fn run(mechanism: &str, seq_len: usize, seed: u64, accuracy: f64) -> CellResult {
        CellResult {
            run_dir: PathBuf::from(format!("{mechanism}-{seq_len}-{seed}")),
            mechanism: mechanism.into(),
            seq_len,
            num_kv_pairs: 4,
            d_model: 32,
            lr: 1e-3,
            seed,
            accuracy,
            state_zoology: None,
            mad: None,
        }
    }

    fn report() -> SweepReport {
        SweepReport {
            summary: summarise(vec![
                run("based", 64, 0, 0.5),
                run("based", 64, 1, 0.7),
                run("softmax", 64, 0, 0.9),
                run("softmax", 128, 0, 0.8),
            ]),
        }
    }

    #[test]
    fn the_table_has_a_row_per_point_and_a_figure_per_length() {
        let report = report();
        let csv: Vec<String> = report.csv().lines().map(str::to_string).collect();
        assert_eq!(
            csv[0],
            "mechanism,seq_len,num_kv_pairs,d_model,best_lr,mean,std,seeds,state_zoology"
        );
        assert!(csv[1].starts_with("based,64,4,32,0.001,"), "{csv:?}");
        assert!(csv[1].ends_with(",2,"), "two seeds, no state: {csv:?}");
        assert_eq!(csv.len(), 4);
        assert_eq!(render(&report, Format::Csv).unwrap(), csv.join("\n") + "\n");
        let text = report.text();
        assert_eq!(text.len(), 4);
        let header: Vec<&str> = text[0].split_whitespace().collect();
        assert_eq!(header.join(","), csv[0]);
        let suffixes: Vec<String> = report.figures().into_iter().map(|(s, _)| s).collect();
        assert_eq!(suffixes, ["L64-N4", "L128-N4"]);
        let json = render(&report, Format::Json).unwrap();
        assert!(json.starts_with("{\n  \"runs\""), "{json}");
    }

    /// A sweep of MAD's probes only: MAD's table alone in the text, its figure among them.
    #[test]
    fn mad_runs_give_mads_table_and_figure() {
        let mut cell = run("softmax", 128, 0, 0.5);
        cell.mad = Some(crate::sweep::mad::MadCell {
            probe: "in-context-recall".into(),
            setting: "baseline".into(),
            weight_decay: 0.1,
            last_accuracy: 0.75,
            metric: crate::preset::Metric::Macro,
            epochs: 10.0,
        });
        let report = SweepReport {
            summary: summarise(vec![cell]),
        };
        assert!(report.summary.points.is_empty(), "no MQAR point");
        let text = report.text();
        assert_eq!(text.len(), 2, "{text:?}");
        let row: Vec<&str> = text[1].split_whitespace().collect();
        assert_eq!(row[..4], ["softmax", "in-context-recall", "0.75", "0.941"]);
        let suffixes: Vec<String> = report.figures().into_iter().map(|(s, _)| s).collect();
        assert_eq!(suffixes, ["mad"]);
    }

    #[test]
    fn writing_puts_the_summary_and_each_panel_in_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let written = report().write(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "summary.json",
                "accuracy-L64-N4.svg",
                "accuracy-L64-N4.csv",
                "accuracy-L128-N4.svg",
                "accuracy-L128-N4.csv"
            ]
        );
        assert!(written.iter().all(|p| p.is_file()));
    }
}
