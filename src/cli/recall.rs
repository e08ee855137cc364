//! `attnlab iou | spectrum`: the in-context recall analyses of a trained run.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use super::analyse::{TableFormat, with_suffix};
use crate::analysis::TrainedRun;
use crate::analysis::iou::{Binarise, IouProtocol, IouTable, Target, example_iou, run_iou};
use crate::analysis::spectrum::{RunSpectrum, SpectrumProtocol, run_spectrum};
use crate::figures::{self, recall};

/// The most test rows an analysis scores (`--examples`).
const MAX_EXAMPLES: u64 = crate::analysis::trained::MAX_TEST_ROWS as u64;

fn parse_binarise(text: &str) -> Result<Binarise, String> {
    text.parse().map_err(|e: crate::Error| e.to_string())
}

fn parse_target(text: &str) -> Result<Target, String> {
    match text {
        "value" => Ok(Target::Value),
        "key" => Ok(Target::Key),
        _ => Err(format!("'{text}' is neither 'value' nor 'key'")),
    }
}

/// Runs a library analysis that reports fractions done, behind a progress bar on stderr (hidden
/// when stderr is not a terminal). The CLI never cancels, so `None` cannot come back.
pub(super) fn with_progress<T>(
    what: &str,
    analysis: impl FnOnce(&mut dyn FnMut(f32), &AtomicBool) -> crate::Result<Option<T>>,
) -> anyhow::Result<T> {
    let bar = ProgressBar::new(1000);
    bar.set_style(ProgressStyle::with_template(&format!(
        "{what} [{{elapsed_precise}}] {{bar:30}} {{percent}}% (eta {{eta}})"
    ))?);
    let result = analysis(
        &mut |f| bar.set_position((f * 1000.0) as u64),
        &AtomicBool::new(false),
    )?;
    bar.finish_and_clear();
    result.ok_or_else(|| anyhow::anyhow!("{what} was cancelled"))
}

/// A run's name for legends: its folder's name.
fn run_label(dir: &std::path::Path) -> String {
    dir.file_name().map_or_else(
        || dir.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// `attnlab iou` options.
#[derive(Debug, Args)]
pub struct IouArgs {
    /// A run folder of an MQAR run (runs/<time>-<name>).
    run: PathBuf,
    /// Test rows to average over (the paper uses 10,000; at most 100,000); rows past the run's
    /// test set come from the same test generator.
    #[arg(long, default_value_t = 10_000, value_parser = super::bounded(1, MAX_EXAMPLES))]
    examples: usize,
    /// How a cropped attention row becomes positions: threshold:T (default τ = 0.1), argmax
    /// (saturates near 100% accuracy) or topk:K. Soft IoU is always reported beside it.
    #[arg(long, default_value_t = crate::analysis::iou::DEFAULT_BINARISE, value_parser = parse_binarise)]
    binarise: Binarise,
    /// Ground-truth position of a query: the `value` token after its key, or the `key`.
    #[arg(long, default_value = "value", value_parser = parse_target)]
    target: Target,
    #[arg(long, value_enum, default_value_t = TableFormat::Text)]
    format: TableFormat,
    /// Write the layers × heads hard-IoU heatmap (.svg, .png or .csv); soft IoU goes to
    /// NAME-soft.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Also score one test row (the example view), at --layer and --head.
    #[arg(long)]
    example: Option<usize>,
    /// Model layer of the example (default: the last attention layer).
    #[arg(long)]
    layer: Option<usize>,
    #[arg(long, default_value_t = 0)]
    head: usize,
    /// Write the example's attention and ground truth (NAME-attention.EXT, NAME-truth.EXT).
    #[arg(long, requires = "example")]
    example_figure: Option<PathBuf>,
    /// Another run to compare in the --bars chart, scored with the same protocol (repeatable).
    #[arg(long = "with", value_name = "RUN", requires = "bars")]
    others: Vec<PathBuf>,
    /// Write hard and soft IoU of RUN and every --with run as grouped bars (.svg, .png or .csv).
    #[arg(long)]
    bars: Option<PathBuf>,
}

/// `attnlab iou`.
pub fn iou(args: &IouArgs) -> anyhow::Result<()> {
    let run = TrainedRun::open(&args.run)?;
    let protocol = IouProtocol {
        binarise: args.binarise,
        target: args.target,
        examples: args.examples,
    };
    let table = with_progress("IoU", |progress, cancel| {
        run_iou(&run, &protocol, progress, cancel)
    })?;
    if let Some(path) = &args.figure {
        figures::save(&recall::iou_table(&table, false), path)?;
        figures::save(&recall::iou_table(&table, true), &with_suffix(path, "soft"))?;
    }
    if let Some(path) = &args.bars {
        let mut runs = vec![(run_label(&args.run), table.clone())];
        for other in &args.others {
            let run = TrainedRun::open(other)?;
            let table = with_progress("IoU", |progress, cancel| {
                run_iou(&run, &protocol, progress, cancel)
            })?;
            runs.push((run_label(other), table));
        }
        let runs: Vec<(String, &IouTable)> = runs.iter().map(|(n, t)| (n.clone(), t)).collect();
        figures::save(&recall::iou_bars(&runs), path)?;
    }
    let example = match args.example {
        Some(row) => {
            let layer = match args.layer {
                Some(layer) => layer,
                None => *table.layers.last().ok_or_else(|| {
                    anyhow::anyhow!("the run has no attention layer to take an example from")
                })?,
            };
            let example = example_iou(&run, row, layer, args.head, &protocol)?;
            if let Some(path) = &args.example_figure {
                let [attention, truth] = recall::iou_example(&example, &table.mechanism);
                figures::save(&attention, &with_suffix(path, "attention"))?;
                figures::save(&truth, &with_suffix(path, "truth"))?;
            }
            Some(example)
        }
        None => None,
    };
    match args.format {
        TableFormat::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "run": args.run, "mechanism": table.mechanism, "protocol": table.protocol,
                "protocol_text": table.protocol.describe(), "examples": table.examples,
                "layers": table.layers, "hard": table.hard, "soft": table.soft,
                "hard_std": table.hard_std, "soft_std": table.soft_std,
                "example": example.as_ref().map(|e| json!({
                    "row": e.row, "layer": e.layer, "head": e.head, "hard": e.hard,
                    "soft": e.soft, "query_positions": e.crop.query_positions,
                })),
            }))?
        ),
        TableFormat::Csv => {
            outln!("layer,head,hard,soft,hard_std,soft_std,binarise,target,examples");
            for c in table.cells() {
                outln!(
                    "{},{},{},{},{},{},{},{},{}",
                    c.layer,
                    c.head,
                    c.hard,
                    c.soft,
                    c.hard_std,
                    c.soft_std,
                    table.protocol.binarise,
                    table.protocol.target.name(),
                    table.examples
                );
            }
        }
        TableFormat::Text => {
            outln!("{} ({})", args.run.display(), table.mechanism);
            outln!("{}", table.protocol.describe());
            for c in table.cells() {
                outln!(
                    "layer {} head {}: hard {:.4} ± {:.4}   soft {:.4} ± {:.4}",
                    c.layer,
                    c.head,
                    c.hard,
                    c.hard_std,
                    c.soft,
                    c.soft_std
                );
            }
            if let Some(e) = &example {
                outln!(
                    "example: test row {} layer {} head {}: hard {:.4} soft {:.4}",
                    e.row,
                    e.layer,
                    e.head,
                    e.hard,
                    e.soft
                );
            }
        }
    }
    Ok(())
}

/// `attnlab spectrum` options.
#[derive(Debug, Args)]
pub struct SpectrumArgs {
    /// One or more run folders of MQAR runs; several are overlaid (e.g. Linformer runs with
    /// different k beside a softmax run).
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Test rows whose attention matrices are averaged over (at most 100,000).
    #[arg(long, default_value_t = 1000, value_parser = super::bounded(1, MAX_EXAMPLES))]
    examples: usize,
    /// Normalise σ² (the energy kept by the best rank-i approximation) instead of σ.
    #[arg(long)]
    squared: bool,
    /// 1-based index of the heatmap's cumulative value (default: a quarter of the columns).
    #[arg(long)]
    at: Option<usize>,
    #[arg(long, value_enum, default_value_t = TableFormat::Text)]
    format: TableFormat,
    /// Write the cumulative curves (.svg, .png or .csv); each run's layers × heads heatmap goes
    /// to NAME-heatmap.EXT (NAME-heatmap-<run number>.EXT with several runs).
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab spectrum`.
pub fn spectrum(args: &SpectrumArgs) -> anyhow::Result<()> {
    let protocol = SpectrumProtocol {
        examples: args.examples,
        squared: args.squared,
        at: args.at,
    };
    let mut spectra = Vec::new();
    for path in &args.runs {
        let run = TrainedRun::open(path)?;
        let what = format!("spectrum of {}", path.display());
        let spectrum = with_progress(&what, |progress, cancel| {
            run_spectrum(&run, &protocol, progress, cancel)
        })?;
        spectra.push((spectrum_label(&spectrum), spectrum));
    }
    if let Some(path) = &args.figure {
        let labelled: Vec<(String, &RunSpectrum)> =
            spectra.iter().map(|(l, s)| (l.clone(), s)).collect();
        figures::save(&recall::spectrum_curves(&labelled), path)?;
        for (i, (label, spectrum)) in spectra.iter().enumerate() {
            let suffix = if spectra.len() > 1 {
                format!("heatmap-{}", i + 1)
            } else {
                "heatmap".into()
            };
            figures::save(
                &recall::spectrum_heatmap(label, spectrum),
                &with_suffix(path, &suffix),
            )?;
        }
    }
    match args.format {
        TableFormat::Json => {
            let runs: Vec<_> = args
                .runs
                .iter()
                .zip(&spectra)
                .map(|(path, (label, s))| json!({"run": path, "label": label, "spectrum": s}))
                .collect();
            outln!("{}", serde_json::to_string_pretty(&json!({"runs": runs}))?);
        }
        TableFormat::Csv => {
            outln!("run,layer,head,index,singular_value,cumulative");
            for (label, s) in &spectra {
                for (l, layer) in s.layers.iter().enumerate() {
                    for (h, sigma) in s.singular_values[l].iter().enumerate() {
                        for (i, value) in sigma.iter().enumerate() {
                            let c = s.cumulative[l][h][i];
                            outln!("{label},{layer},{h},{},{value},{c}", i + 1);
                        }
                    }
                }
            }
        }
        TableFormat::Text => {
            for (label, s) in &spectra {
                outln!("{label}: {}", s.protocol.describe(s.at));
                for (l, layer) in s.layers.iter().enumerate() {
                    let cells: Vec<String> =
                        s.at_value[l].iter().map(|c| format!("{c:.4}")).collect();
                    outln!("  layer {layer}: c({}) per head {}", s.at, cells.join(" "));
                }
            }
        }
    }
    Ok(())
}

/// A run's name in figures and tables: its mechanism, with k for Linformer.
fn spectrum_label(spectrum: &RunSpectrum) -> String {
    match spectrum.proj_dim {
        Some(k) => format!("{} k={k}", spectrum.mechanism),
        None => spectrum.mechanism.clone(),
    }
}
