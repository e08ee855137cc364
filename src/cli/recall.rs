//! `attnlab iou | spectrum`: the in-context recall analyses of a trained run.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::analysis::TrainedRun;
use crate::analysis::figures::recall;
use crate::analysis::iou::{Binarise, IouProtocol, IouTable, Target, example_iou, run_iou};
use crate::analysis::spectrum::{SpectrumProtocol, run_spectrum};
use crate::figures;
use crate::report::recall::{IouReport, SpectrumReport};
use crate::report::{Format, render, save_figures, with_suffix};
use crate::train::run_dir::folder_name;

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

/// `attnlab iou` options.
#[derive(Debug, Args)]
pub struct IouArgs {
    /// A run folder (runs/<time>-<name>) of a task with a ground truth: MQAR, or MAD's
    /// in-context recall, noisy recall or selective copying.
    run: PathBuf,
    /// Test rows to average over (the paper uses 10,000; at most 100,000); rows past the run's
    /// test set come from the same test generator (a run on mad-lab's published data has
    /// only the folder's).
    #[arg(long, default_value_t = 10_000, value_parser = super::bounded(1, MAX_EXAMPLES))]
    examples: usize,
    /// How a cropped attention row becomes positions for hard IoU: threshold:T (default
    /// τ = 0.1), argmax (saturates near 100% accuracy) or topk:K. Soft IoU, which has no
    /// threshold, leads the report; hard IoU is also given at each τ of 0.01 to 0.7.
    #[arg(long, default_value_t = crate::analysis::iou::DEFAULT_BINARISE, value_parser = parse_binarise)]
    binarise: Binarise,
    /// Ground-truth position of a query: the `value` token after its key, or the `key`.
    #[arg(long, default_value = "value", value_parser = parse_target)]
    target: Target,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the layers × heads hard-IoU heatmap (.svg, .png or .csv); soft IoU goes to
    /// NAME-soft.EXT, hard IoU against its threshold τ to NAME-thresholds.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Also score one test row (the example view), at --layer and --head.
    #[arg(long)]
    example: Option<usize>,
    /// Model layer of the example (default: the last attention layer).
    #[arg(long, requires = "example")]
    layer: Option<usize>,
    /// Head of the example (its range is checked against the run's heads).
    #[arg(long, default_value_t = 0, requires = "example")]
    head: usize,
    /// Write the example's attention and ground truth (NAME-attention.EXT, NAME-truth.EXT).
    #[arg(long, requires = "example")]
    example_figure: Option<PathBuf>,
    /// Another run to compare in the --bars chart, scored with the same protocol (repeatable).
    #[arg(long = "with", value_name = "RUN", requires = "bars")]
    others: Vec<PathBuf>,
    /// Write soft and hard IoU of RUN and every --with run as grouped bars (.svg, .png or .csv),
    /// and their hard IoU against its threshold τ to NAME-thresholds.EXT.
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
        ..IouProtocol::default()
    };
    let table = with_progress("IoU", |progress, cancel| {
        run_iou(&run, &protocol, progress, cancel)
    })?;
    if let Some(path) = &args.bars {
        let mut runs = vec![(folder_name(&args.run), table.clone())];
        for other in &args.others {
            let run = TrainedRun::open(other)?;
            let table = with_progress("IoU", |progress, cancel| {
                run_iou(&run, &protocol, progress, cancel)
            })?;
            runs.push((folder_name(other), table));
        }
        let runs: Vec<(String, &IouTable)> = runs.iter().map(|(n, t)| (n.clone(), t)).collect();
        figures::save(&recall::iou_bars(&runs), path)?;
        figures::save(
            &recall::iou_thresholds(&runs),
            &with_suffix(path, "thresholds"),
        )?;
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
    let report = IouReport::new(args.run.clone(), table, example.as_ref());
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}

/// `attnlab spectrum` options.
#[derive(Debug, Args)]
pub struct SpectrumArgs {
    /// One or more run folders of tasks with a ground truth (MQAR, MAD's retrieval probes);
    /// several are overlaid (e.g. Linformer runs with different k beside a softmax run).
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
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
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
        spectra.push((path.clone(), spectrum));
    }
    let report = SpectrumReport::new(spectra);
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}
