//! `attnlab eval`: evaluate a run's checkpoint on its test set, optionally with preset keys
//! changed, e.g. a RoPE-trained model scored with ReRoPE, PI or NTK scaling as their authors
//! apply them (at inference, no retraining).

use std::path::Path;

use serde_json::json;

use crate::Preset;
use crate::train::{RunDir, Trainer};

pub fn eval(run: &Path, overrides: &[String], json_output: bool) -> anyhow::Result<()> {
    let run = RunDir::open(run)?;
    let origin = run.path().join("preset.toml");
    let text = crate::io::read_text(&origin, "preset", crate::io::MAX_TEXT_FILE)?;
    let trained = Preset::parse(&text, &[], &origin)?;
    let mut preset = Preset::parse(&text, overrides, &origin)?;
    // Settings that default to the training length (ReRoPE's log-n L, DIET-REL's table) keep
    // the run's, whatever task.seq_len the evaluation uses.
    preset.encoding = preset.encoding.at_training_length(trained.task.seq_len());
    let trainer = Trainer::new(&preset)?;
    trainer.params().load(&run.checkpoint_path())?;
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
