//! `attnlab curves`: the Training view's curves of run folders, for a terminal or a batch job.

use std::path::PathBuf;

use clap::Args;

use crate::report::training::{RecordedRun, TrainingReport};
use crate::report::{Format, render, save_figures};

/// `attnlab curves` options.
#[derive(Debug, Args)]
pub struct CurvesArgs {
    /// One or more run folders (runs/<time>-<name>); several are overlaid, each named by its
    /// folder.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// text: a line per run (setup, steps, last loss, best test accuracy); json; csv: every
    /// point of every curve.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the loss curves (.svg, .png or .csv); test accuracy goes to NAME-accuracy.EXT and
    /// the learning rate to NAME-lr.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab curves`.
pub fn curves(args: &CurvesArgs) -> anyhow::Result<()> {
    let recorded = args
        .runs
        .iter()
        .map(|dir| RecordedRun::read(dir))
        .collect::<crate::Result<Vec<_>>>()?;
    let report = TrainingReport {
        runs: recorded.iter().map(RecordedRun::as_run).collect(),
    };
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}
