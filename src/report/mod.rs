//! The report layer: an analysis's result as one serialisable value that carries its figures as
//! data. The CLI prints it ([`render`]: text, CSV or JSON) and saves its figures
//! ([`save_figures`]); the window draws the same figures and exports them with the same
//! renderers. A command is then its arguments, one call that builds the report, and these two.

pub mod attend;
pub mod bench;
pub mod encodings;
pub mod extrapolation;
pub mod heads;
pub mod recall;
pub mod sweep;
pub mod table;
pub mod training;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use table::Table;

use crate::Result;
use crate::figures::{self, Figure};

/// How a report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table in words.
    Text,
    /// Tidy CSV.
    Csv,
    /// The whole report.
    Json,
}

/// An analysis's result as every front end renders it.
pub trait Report: Serialize {
    /// A table in words for the terminal, one line per row.
    fn text(&self) -> Vec<String>;

    /// The figures, each with the suffix its file gets (`""`: the main figure, saved under the
    /// path asked for; `"decay"`: saved as `NAME-decay.EXT`).
    fn figures(&self) -> Vec<(String, Figure)>;

    /// Tidy CSV; by default the numbers of the main figure.
    fn csv(&self) -> String {
        self.figures()
            .first()
            .map(|(_, figure)| figures::render_csv(figure))
            .unwrap_or_default()
    }
}

/// `report` printed as `format`, ending with a newline.
pub fn render(report: &impl Report, format: Format) -> Result<String> {
    Ok(match format {
        Format::Json => format!("{}\n", serde_json::to_string_pretty(report)?),
        Format::Csv => report.csv(),
        Format::Text => report
            .text()
            .iter()
            .map(|line| format!("{line}\n"))
            .collect(),
    })
}

/// Saves every figure of `report`: the main one at `path`, the others beside it with their
/// suffix (the extension picks the format). Returns the files written.
pub fn save_figures(report: &impl Report, path: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (suffix, figure) in report.figures() {
        let file = match suffix.as_str() {
            "" => path.to_path_buf(),
            suffix => with_suffix(path, suffix),
        };
        figures::save(&figure, &file)?;
        written.push(file);
    }
    Ok(written)
}

/// Adds `new` to `entries`, each replacing an older entry of the same run folder (`run` says
/// which): a run analysed again in the window replaces its old result instead of doubling it.
pub fn replace_runs<T>(entries: &mut Vec<T>, new: Vec<T>, run: impl Fn(&T) -> &Path) {
    for entry in new {
        entries.retain(|e| run(e) != run(&entry));
        entries.push(entry);
    }
}

/// `out.png` → `out-<label>.png`, with the label made file-name safe.
pub fn with_suffix(path: &Path, label: &str) -> PathBuf {
    let safe: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("figure");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("svg");
    path.with_file_name(format!("{stem}-{safe}.{ext}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::{LinePlot, Plot, Series};

    #[derive(Serialize)]
    struct Two {
        value: u8,
    }

    fn line(title: &str) -> Figure {
        Figure {
            title: title.into(),
            caption: None,
            plot: Plot::Lines(LinePlot {
                x_label: "x".into(),
                y_label: "y".into(),
                x_log: false,
                y_log: false,
                series: vec![Series {
                    name: "s".into(),
                    points: vec![(1.0, 2.0)],
                    dashed: false,
                    colour: None,
                }],
            }),
        }
    }

    impl Report for Two {
        fn text(&self) -> Vec<String> {
            vec![format!("value {}", self.value)]
        }

        fn figures(&self) -> Vec<(String, Figure)> {
            vec![
                (String::new(), line("main")),
                ("other".into(), line("other")),
            ]
        }
    }

    #[test]
    fn a_report_renders_in_every_format_and_saves_each_figure() {
        let report = Two { value: 7 };
        assert_eq!(render(&report, Format::Text).unwrap(), "value 7\n");
        assert!(
            render(&report, Format::Json)
                .unwrap()
                .contains("\"value\": 7")
        );
        assert!(render(&report, Format::Csv).unwrap().contains("1,2"));
        let dir = tempfile::tempdir().unwrap();
        let written = save_figures(&report, &dir.path().join("f.svg")).unwrap();
        assert_eq!(
            written,
            [dir.path().join("f.svg"), dir.path().join("f-other.svg")]
        );
        assert!(written.iter().all(|f| f.is_file()));
    }

    #[test]
    fn suffixes_are_made_file_name_safe() {
        let path = with_suffix(Path::new("out/fig.png"), "kerple log/2");
        assert_eq!(path, Path::new("out/fig-kerple_log_2.png"));
    }
}
