//! Reports of the in-context recall analyses: IoU of attention against the MQAR ground truth
//! (the ReBased paper's Table 5, [`IouReport`]) and attention spectra (Linformer's Figure 1,
//! [`SpectrumReport`]).

use std::path::PathBuf;

use serde::Serialize;

use super::Report;
use crate::analysis::figures::recall;
use crate::analysis::iou::{ExampleIou, IouTable, THRESHOLD_CURVE};
use crate::analysis::spectrum::RunSpectrum;
use crate::figures::Figure;

/// One scored test row, as the report carries it.
#[derive(Clone, Debug, Serialize)]
pub struct ExampleSummary {
    pub row: usize,
    pub layer: usize,
    pub head: usize,
    pub hard: f64,
    pub soft: f64,
    pub query_positions: Vec<usize>,
}

impl From<&ExampleIou> for ExampleSummary {
    fn from(e: &ExampleIou) -> Self {
        Self {
            row: e.row,
            layer: e.layer,
            head: e.head,
            hard: e.hard,
            soft: e.soft,
            query_positions: e.crop.query_positions.clone(),
        }
    }
}

/// `attnlab iou`: hard and soft IoU per layer and head of one run, and optionally one example.
#[derive(Clone, Debug, Serialize)]
pub struct IouReport {
    pub run: PathBuf,
    #[serde(flatten)]
    pub table: IouTable,
    pub protocol_text: String,
    pub example: Option<ExampleSummary>,
}

impl IouReport {
    pub fn new(run: PathBuf, table: IouTable, example: Option<&ExampleIou>) -> Self {
        Self {
            run,
            protocol_text: table.protocol.describe(),
            table,
            example: example.map(ExampleSummary::from),
        }
    }
}

impl Report for IouReport {
    fn text(&self) -> Vec<String> {
        let t = &self.table;
        let mut lines = vec![
            format!("{} ({})", self.run.display(), t.mechanism),
            self.protocol_text.clone(),
        ];
        lines.extend(t.cells().map(|c| {
            format!(
                "layer {} head {}: soft {:.4} ± {:.4}   hard {:.4} ± {:.4}",
                c.layer, c.head, c.soft, c.soft_std, c.hard, c.hard_std
            )
        }));
        // Hard IoU at each τ: whether its ranking holds or rests on the threshold.
        let taus: Vec<String> = THRESHOLD_CURVE.iter().map(|t| format!("{t:>6}")).collect();
        lines.push(format!("hard IoU at threshold τ = {}", taus.join(" ")));
        lines.extend(t.cells().map(|c| {
            let values: Vec<String> = t
                .hard_curve(&c)
                .iter()
                .map(|v| format!("{v:>6.3}"))
                .collect();
            format!("  layer {} head {}:{}", c.layer, c.head, values.join(" "))
        }));
        lines.extend(self.example.iter().map(|e| {
            format!(
                "example: test row {} layer {} head {}: hard {:.4} soft {:.4}",
                e.row, e.layer, e.head, e.hard, e.soft
            )
        }));
        lines
    }

    /// The hard-IoU heatmap, the soft one as `NAME-soft`, hard IoU against its threshold as
    /// `NAME-thresholds`.
    fn figures(&self) -> Vec<(String, Figure)> {
        let run = [(self.table.mechanism.clone(), &self.table)];
        vec![
            (String::new(), recall::iou_table(&self.table, false)),
            ("soft".into(), recall::iou_table(&self.table, true)),
            ("thresholds".into(), recall::iou_thresholds(&run)),
        ]
    }

    fn csv(&self) -> String {
        let t = &self.table;
        let mut csv =
            String::from("layer,head,hard,soft,hard_std,soft_std,binarise,target,examples\n");
        for c in t.cells() {
            csv.push_str(&format!(
                "{},{},{},{},{},{},{},{},{}\n",
                c.layer,
                c.head,
                c.hard,
                c.soft,
                c.hard_std,
                c.soft_std,
                t.protocol.binarise,
                t.protocol.target.name(),
                t.examples
            ));
        }
        csv
    }
}

/// One run's spectra in a [`SpectrumReport`].
#[derive(Clone, Debug, Serialize)]
pub struct SpectrumEntry {
    pub run: PathBuf,
    /// Its name in figures and tables: the mechanism (`attnlab spectrum`) or the run (the
    /// window), with k for Linformer.
    pub label: String,
    pub spectrum: RunSpectrum,
}

impl SpectrumEntry {
    /// The entry of `run`, labelled `name` and, for Linformer, the rank bound k of its
    /// matrices ("linformer k=8").
    pub fn new(run: PathBuf, name: String, spectrum: RunSpectrum) -> Self {
        let label = match spectrum.proj_dim {
            Some(k) => format!("{name} k={k}"),
            None => name,
        };
        Self {
            run,
            label,
            spectrum,
        }
    }

    /// The layers × heads heatmap of the cumulative value at the protocol's index.
    pub fn heatmap(&self) -> Figure {
        recall::spectrum_heatmap(&self.label, &self.spectrum)
    }
}

/// `attnlab spectrum` and the Spectra view: the spectra of one or more runs, overlaid.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SpectrumReport {
    pub runs: Vec<SpectrumEntry>,
}

impl SpectrumReport {
    /// The report of `spectra`, each with its run folder.
    pub fn new(spectra: Vec<(PathBuf, RunSpectrum)>) -> Self {
        let runs = spectra
            .into_iter()
            .map(|(run, spectrum)| {
                let name = spectrum.mechanism.clone();
                SpectrumEntry::new(run, name, spectrum)
            })
            .collect();
        Self { runs }
    }

    /// Adds `entries`, each replacing an older entry of the same run folder (the window
    /// recomputing a run).
    pub fn merge(&mut self, entries: Vec<SpectrumEntry>) {
        super::replace_runs(&mut self.runs, entries, |e| &e.run);
    }

    /// The normalised cumulative curves of every run and layer, overlaid.
    pub fn curves(&self) -> Figure {
        let labelled: Vec<(String, &RunSpectrum)> = self
            .runs
            .iter()
            .map(|e| (e.label.clone(), &e.spectrum))
            .collect();
        recall::spectrum_curves(&labelled)
    }
}

impl Report for SpectrumReport {
    fn text(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for SpectrumEntry {
            label, spectrum, ..
        } in &self.runs
        {
            lines.push(format!(
                "{label}: {}",
                spectrum.protocol.describe(spectrum.at)
            ));
            for (l, layer) in spectrum.layers.iter().enumerate() {
                let cells: Vec<String> = spectrum.at_value[l]
                    .iter()
                    .map(|c| format!("{c:.4}"))
                    .collect();
                lines.push(format!(
                    "  layer {layer}: c({}) per head {}",
                    spectrum.at,
                    cells.join(" ")
                ));
            }
        }
        lines
    }

    /// The cumulative curves of every run, then each run's layers × heads heatmap as
    /// `NAME-heatmap` (`NAME-heatmap-<run number>` with several runs).
    fn figures(&self) -> Vec<(String, Figure)> {
        let mut figures = vec![(String::new(), self.curves())];
        for (i, e) in self.runs.iter().enumerate() {
            let suffix = match self.runs.len() {
                1 => "heatmap".to_string(),
                _ => format!("heatmap-{}", i + 1),
            };
            figures.push((suffix, e.heatmap()));
        }
        figures
    }

    fn csv(&self) -> String {
        let mut csv = String::from("run,layer,head,index,singular_value,cumulative\n");
        for SpectrumEntry {
            label, spectrum, ..
        } in &self.runs
        {
            for (l, layer) in spectrum.layers.iter().enumerate() {
                for (h, sigma) in spectrum.singular_values[l].iter().enumerate() {
                    for (i, value) in sigma.iter().enumerate() {
                        let c = spectrum.cumulative[l][h][i];
                        csv.push_str(&format!("{label},{layer},{h},{},{value},{c}\n", i + 1));
                    }
                }
            }
        }
        csv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spectra_are_labelled_by_mechanism_and_a_recomputed_run_replaces_its_entry() {
        let mut report = SpectrumReport::new(vec![
            ("a".into(), RunSpectrum::fixture("softmax", None)),
            ("b".into(), RunSpectrum::fixture("linformer", Some(8))),
        ]);
        let labels: Vec<&str> = report.runs.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["softmax", "linformer k=8"]);
        assert_eq!(report.text()[1], "  layer 0: c(1) per head 0.7000");
        let suffixes: Vec<String> = report.figures().into_iter().map(|(s, _)| s).collect();
        assert_eq!(suffixes, ["", "heatmap-1", "heatmap-2"]);
        // A header and 2 values of one head in one layer, per run.
        assert_eq!(report.csv().lines().count(), 5);
        let again = SpectrumEntry {
            run: "a".into(),
            label: "again".into(),
            spectrum: RunSpectrum::fixture("softmax", None),
        };
        report.merge(vec![again]);
        let labels: Vec<&str> = report.runs.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(labels, ["linformer k=8", "again"]);
        assert_eq!(report.figures()[2].1.title, report.runs[1].heatmap().title);
    }
}
