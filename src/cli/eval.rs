//! `attnlab eval`: evaluate a run's checkpoint on its test set, optionally with preset keys
//! changed, e.g. a RoPE-trained model scored with ReRoPE, PI or NTK scaling as their authors
//! apply them (at inference, no retraining).

use std::path::Path;

use serde_json::json;

use crate::train::{RunDir, Trainer};

pub fn eval(run: &Path, overrides: &[String], json_output: bool) -> anyhow::Result<()> {
    let run = RunDir::open(run)?;
    let preset = run.preset_with(overrides)?;
    let trainer = Trainer::new(&preset)?;
    run.load_checkpoint(trainer.params())?;
    let stats = trainer.evaluate()?;
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
