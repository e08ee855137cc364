//! `attnlab eval`: evaluate a run's checkpoint on its test set, optionally with preset keys
//! changed, e.g. a RoPE-trained model scored with ReRoPE, PI or NTK scaling as their authors
//! apply them (at inference, no retraining).

use std::path::Path;

use serde_json::json;

use crate::train::{LoadedRun, Opening, RunDir, evaluate};

pub fn eval(run: &Path, overrides: &[String], json_output: bool) -> anyhow::Result<()> {
    let run = RunDir::open(run)?;
    let LoadedRun {
        preset,
        model,
        device,
        ..
    } = LoadedRun::open(&run, &Opening::default().overrides(overrides))?;
    let (_, test) = preset.task.datasets()?;
    let stats = evaluate(&model, &test, &device, 1)?[0];
    if json_output {
        outln!(
            "{}",
            json!({"run": run.path(), "encoding": preset.encoding, "overrides": overrides,
                   "accuracy": stats.accuracy, "loss": stats.loss})
        );
    } else {
        outln!(
            "{} with {}: test accuracy {:.2}%, loss {:.4}",
            run.path().display(),
            preset.encoding.name(),
            100.0 * stats.accuracy,
            stats.loss
        );
    }
    Ok(())
}
