//! `attnlab eval`: evaluate a run's checkpoint on its test set, optionally with preset keys
//! changed, e.g. a RoPE-trained model scored with ReRoPE, PI or NTK scaling as their authors
//! apply them (at inference, no retraining).

use std::path::Path;

use crate::report::training::EvalReport;
use crate::report::{Format, render};
use crate::train::{LoadedRun, Opening, RunDir, evaluate};

pub fn eval(run: &Path, overrides: &[String], format: Format) -> anyhow::Result<()> {
    let run = RunDir::open(run)?;
    let LoadedRun {
        preset,
        model,
        device,
        ..
    } = LoadedRun::open(&run, &Opening::default().overrides(overrides))?;
    let (_, test) = preset.task.datasets()?;
    let stats = evaluate(&model, &test, &device, 1)?[0];
    let report = EvalReport {
        run: run.path().to_path_buf(),
        encoding: preset.encoding,
        overrides: overrides.to_vec(),
        accuracy: stats.accuracy,
        loss: stats.loss,
    };
    out!("{}", render(&report, format)?);
    Ok(())
}
