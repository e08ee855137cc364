//! A whole training run: drives a [`Trainer`], writes the run folder, emits events.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::run_dir::{AttentionExample, AttentionIndex, AttentionLayerFile};
use super::trainer::{EvalStats, StepStats};
use super::{
    EvalRecord, MetricRecord, RunDir, RunStatus, StepRecord, Summary, TrainEvent, Trainer,
};
use crate::preset::Preset;
use crate::{Error, Result};

/// Trains `preset` into a new folder under `runs_root`, calling `emit` for every event, until
/// the planned steps are done, the target accuracy is reached, or `stop` is set (checked every
/// step). Returns the final summary; on error, `Failed` has been emitted and what was saved stays.
pub fn run(
    preset: &Preset,
    runs_root: &Path,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<Summary> {
    let mut run_dir = None;
    let result = run_inner(preset, runs_root, stop, emit, &mut run_dir);
    if let Err(error) = &result {
        emit(TrainEvent::Failed {
            message: error.to_string(),
            run_dir: run_dir.map(|d: RunDir| d.path().to_path_buf()),
        });
    }
    result
}

/// Mutable state of a run between steps.
struct Progress {
    summary: Summary,
    started: Instant,
    tokens: usize,
    training_secs: f64,
}

fn run_inner(
    preset: &Preset,
    runs_root: &Path,
    stop: &AtomicBool,
    emit: &mut dyn FnMut(TrainEvent),
    run_dir_out: &mut Option<RunDir>,
) -> Result<Summary> {
    preset.validate()?;
    let mut trainer = Trainer::new(preset)?;
    let dir = RunDir::create(runs_root, preset)?;
    *run_dir_out = Some(dir.clone());
    dir.write_preset(preset)?;
    let mut progress = Progress {
        summary: initial_summary(preset, &trainer),
        started: Instant::now(),
        tokens: 0,
        training_secs: 0.0,
    };
    dir.write_summary(&progress.summary)?;
    emit(TrainEvent::Started {
        run_dir: dir.path().to_path_buf(),
        total_steps: trainer.total_steps(),
        steps_per_epoch: trainer.steps_per_epoch(),
        n_params: trainer.params().count(),
        device_notice: trainer.device_notice().map(str::to_string),
        precision_note: crate::device::precision_note(trainer.device(), preset.train.precision),
    });

    let eval_interval = preset.train.eval_interval(preset.task.train_examples());
    let outcome = loop {
        if trainer.step() >= trainer.total_steps() {
            break RunStatus::Completed;
        }
        if stop.load(Ordering::Relaxed) {
            break RunStatus::Stopped;
        }
        let step_started = Instant::now();
        let stats = match trainer.train_step() {
            Ok(stats) => stats,
            Err(error) => {
                fail(&dir, &mut progress, &error)?;
                return Err(error);
            }
        };
        record_step(&dir, &trainer, &mut progress, stats, step_started, emit)?;
        if trainer.step() % eval_interval == 0 || trainer.step() == trainer.total_steps() {
            let eval = trainer.evaluate()?;
            record_eval(&dir, &trainer, &mut progress, eval, emit)?;
            let target = preset.train.target_accuracy;
            if target > 0.0 && eval.accuracy >= target {
                break RunStatus::TargetReached;
            }
        }
    };
    if outcome == RunStatus::Stopped && progress.summary.last_accuracy.is_none() {
        // Stopped before the first evaluation: save what there is, so the run can be analysed.
        let eval = trainer.evaluate()?;
        record_eval(&dir, &trainer, &mut progress, eval, emit)?;
    }
    progress.summary.status = outcome;
    progress.summary.elapsed_secs = progress.started.elapsed().as_secs_f64();
    dir.write_summary(&progress.summary)?;
    emit(TrainEvent::Finished(Box::new(progress.summary.clone())));
    Ok(progress.summary)
}

fn initial_summary(preset: &Preset, trainer: &Trainer) -> Summary {
    Summary {
        name: preset.name.clone(),
        status: RunStatus::Running,
        mechanism: preset.attention.name().into(),
        encoding: preset.encoding.name().into(),
        task: preset.task.name().into(),
        device: trainer.device_name().to_string(),
        device_notice: trainer.device_notice().map(str::to_string),
        precision: preset.train.precision,
        n_params: trainer.params().count(),
        steps: 0,
        total_steps: trainer.total_steps(),
        epoch: 0.0,
        elapsed_secs: 0.0,
        last_loss: None,
        last_accuracy: None,
        best_accuracy: None,
        time_to_target_secs: None,
        tokens_per_s: None,
        error: None,
        attnlab_version: env!("CARGO_PKG_VERSION").into(),
    }
}

fn record_step(
    dir: &RunDir,
    trainer: &Trainer,
    progress: &mut Progress,
    stats: StepStats,
    step_started: Instant,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<()> {
    let step_secs = step_started.elapsed().as_secs_f64();
    progress.tokens += trainer.tokens_per_step();
    progress.training_secs += step_secs;
    let record = StepRecord {
        step: trainer.step(),
        epoch: trainer.epoch(),
        loss: stats.loss,
        lr: stats.lr,
        grad_norm: stats.grad_norm,
        tokens_per_s: trainer.tokens_per_step() as f64 / step_secs.max(1e-9),
        elapsed_secs: progress.started.elapsed().as_secs_f64(),
    };
    dir.append_metric(&MetricRecord::Step(record.clone()))?;
    let summary = &mut progress.summary;
    summary.steps = record.step;
    summary.epoch = record.epoch;
    summary.last_loss = Some(record.loss);
    summary.elapsed_secs = record.elapsed_secs;
    summary.tokens_per_s = Some(progress.tokens as f64 / progress.training_secs.max(1e-9));
    emit(TrainEvent::Step(record));
    Ok(())
}

/// Logs an evaluation, saves checkpoint, attention and summary.
fn record_eval(
    dir: &RunDir,
    trainer: &Trainer,
    progress: &mut Progress,
    eval: EvalStats,
    emit: &mut dyn FnMut(TrainEvent),
) -> Result<()> {
    let record = EvalRecord {
        step: trainer.step(),
        epoch: trainer.epoch(),
        accuracy: eval.accuracy,
        loss: eval.loss,
        elapsed_secs: progress.started.elapsed().as_secs_f64(),
    };
    dir.append_metric(&MetricRecord::Eval(record.clone()))?;
    trainer.params().save(&dir.checkpoint_path())?;
    save_attention(dir, trainer)?;
    let summary = &mut progress.summary;
    summary.last_accuracy = Some(eval.accuracy);
    summary.best_accuracy = Some(summary.best_accuracy.unwrap_or(0.0).max(eval.accuracy));
    let target = trainer.preset().train.target_accuracy;
    if target > 0.0 && eval.accuracy >= target && summary.time_to_target_secs.is_none() {
        summary.time_to_target_secs = Some(record.elapsed_secs);
    }
    dir.write_summary(summary)?;
    emit(TrainEvent::Eval(record));
    Ok(())
}

/// Saves the attention of the first `eval.attention_examples` test rows.
fn save_attention(dir: &RunDir, trainer: &Trainer) -> Result<()> {
    let preset = trainer.preset();
    let rows: Vec<usize> =
        (0..preset.eval.attention_examples.min(trainer.test_set().len())).collect();
    let mut layers = Vec::new();
    let mut tensors = Vec::new();
    for (layer, weights) in trainer.attention_of(&rows)?.into_iter().enumerate() {
        if let Some(weights) = weights {
            layers.push(AttentionLayerFile {
                layer,
                file: format!("layer{layer}.npy"),
                shape: weights.dims().to_vec(),
            });
            tensors.push(weights.to_device(&candle_core::Device::Cpu)?);
        }
    }
    let test = trainer.test_set();
    let examples = rows
        .iter()
        .map(|&row| AttentionExample {
            row,
            inputs: test.row(row).to_vec(),
            labels: test.row_labels(row).to_vec(),
            queries: test.queries.get(row).cloned().unwrap_or_default(),
        })
        .collect();
    let index = AttentionIndex {
        mechanism: preset.attention.name().into(),
        encoding: preset.encoding.name().into(),
        step: trainer.step(),
        layers,
        examples,
    };
    dir.write_attention(&index, &tensors)
}

/// Marks the run failed in its summary; the last checkpoint (from the last evaluation) stays.
fn fail(dir: &RunDir, progress: &mut Progress, error: &Error) -> Result<()> {
    progress.summary.status = RunStatus::Failed;
    progress.summary.error = Some(error.to_string());
    progress.summary.elapsed_secs = progress.started.elapsed().as_secs_f64();
    dir.write_summary(&progress.summary)
}
