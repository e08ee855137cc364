//! What a training run reports: events for live consumers, records for `metrics.jsonl`,
//! and the run's summary.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One optimiser step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Steps done so far (1 after the first step).
    pub step: usize,
    /// Fractional epochs done.
    pub epoch: f64,
    pub loss: f32,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
    pub elapsed_secs: f64,
}

/// One evaluation on the test split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    pub step: usize,
    pub epoch: f64,
    /// Fraction of scored positions predicted exactly.
    pub accuracy: f64,
    pub loss: f64,
    pub elapsed_secs: f64,
}

/// A line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum MetricRecord {
    Step(StepRecord),
    Eval(EvalRecord),
}

/// How a run stands or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Running,
    /// All planned steps done.
    Completed,
    /// Stopped early because test accuracy reached the target.
    TargetReached,
    /// Cancelled by the user.
    Stopped,
    Failed,
}

/// `summary.json`: the state of a run, rewritten at every evaluation and at the end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub status: RunStatus,
    pub mechanism: String,
    pub encoding: String,
    pub task: String,
    pub device: String,
    pub n_params: usize,
    pub steps: usize,
    pub total_steps: usize,
    pub epoch: f64,
    pub elapsed_secs: f64,
    pub last_loss: Option<f32>,
    pub last_accuracy: Option<f64>,
    pub best_accuracy: Option<f64>,
    /// Seconds (training and evaluation) until test accuracy first reached the target.
    pub time_to_target_secs: Option<f64>,
    /// Mean training throughput.
    pub tokens_per_s: Option<f64>,
    pub error: Option<String>,
    pub attnlab_version: String,
}

/// What a running training reports, in order: `Started`, then `Step`/`Eval`, then exactly one
/// of `Finished` or `Failed`.
#[derive(Clone, Debug)]
pub enum TrainEvent {
    Started {
        run_dir: PathBuf,
        total_steps: usize,
        steps_per_epoch: usize,
        n_params: usize,
    },
    Step(StepRecord),
    Eval(EvalRecord),
    /// The run ended normally (completed, target reached, or stopped by the user).
    Finished(Box<Summary>),
    /// The run failed; `run_dir` is set if the folder was created (what was saved is kept).
    Failed {
        message: String,
        run_dir: Option<PathBuf>,
    },
}
