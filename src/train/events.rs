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
    #[serde(with = "float_or_text")]
    pub loss: f32,
    pub lr: f64,
    #[serde(with = "float_or_text")]
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
    /// Macro accuracy (MAD's metric, torchmetrics' default): per target class, the fraction
    /// predicted exactly, averaged over classes; absent in run folders written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macro_accuracy: Option<f64>,
    #[serde(with = "float_or_text")]
    pub loss: f64,
    pub elapsed_secs: f64,
}

/// Losses and norms that may be NaN or infinite (a diverging run), written as the strings
/// "NaN", "inf" and "-inf": JSON has no such numbers and serde_json writes `null`, which did
/// not read back, so the line was dropped. `null` (older files) reads as NaN.
mod float_or_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub trait Float: Copy + Serialize + for<'de> Deserialize<'de> {
        fn is_finite(self) -> bool;
        fn from_f64(x: f64) -> Self;
    }

    impl Float for f32 {
        fn is_finite(self) -> bool {
            f32::is_finite(self)
        }
        fn from_f64(x: f64) -> Self {
            x as f32
        }
    }

    impl Float for f64 {
        fn is_finite(self) -> bool {
            f64::is_finite(self)
        }
        fn from_f64(x: f64) -> Self {
            x
        }
    }

    pub fn serialize<T: Float + std::fmt::Display, S: Serializer>(
        x: &T,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match x.is_finite() {
            true => x.serialize(s),
            false => s.serialize_str(&x.to_string()),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr<T> {
        Number(Option<T>),
        Text(String),
    }

    pub fn deserialize<'de, T: Float, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
        match Repr::<T>::deserialize(d)? {
            Repr::Number(x) => Ok(x.unwrap_or(T::from_f64(f64::NAN))),
            // Rust reads "NaN", "inf", "-inf" (what Display writes) and "infinity".
            Repr::Text(text) => text.parse().map(T::from_f64).map_err(|_| {
                serde::de::Error::custom(format!("{text:?} is not a number, NaN, inf or -inf"))
            }),
        }
    }
}

/// A line of `metrics.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum MetricRecord {
    Step(StepRecord),
    Eval(EvalRecord),
}

impl MetricRecord {
    /// `records` as the training steps and the evaluations among them, each in their order.
    pub fn split(records: Vec<Self>) -> (Vec<StepRecord>, Vec<EvalRecord>) {
        let (mut steps, mut evals) = (Vec::new(), Vec::new());
        for record in records {
            match record {
                Self::Step(step) => steps.push(step),
                Self::Eval(eval) => evals.push(eval),
            }
        }
        (steps, evals)
    }

    /// The step the record was logged at.
    pub fn step(&self) -> usize {
        match self {
            Self::Step(record) => record.step,
            Self::Eval(record) => record.step,
        }
    }
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

impl RunStatus {
    /// The status in words, for people (`summary.json` keeps the kebab-case names).
    pub fn describe(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::TargetReached => "reached target accuracy",
            Self::Stopped => "stopped",
            Self::Failed => "failed",
        }
    }

    /// The status in words with a failed run's reason ("failed: out of memory"): the one name
    /// the window's run list, progress bar and sweep grid show.
    pub fn explain(self, error: Option<&str>) -> String {
        match (self, error) {
            (Self::Failed, Some(error)) => format!("failed: {error}"),
            _ => self.describe().to_string(),
        }
    }
}

/// `summary.json`: the state of a run, rewritten at every evaluation and at the end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub status: RunStatus,
    pub mechanism: String,
    pub encoding: String,
    pub task: String,
    /// The text a language model trained on, `task.corpus` as it resolved on the machine that
    /// trained (`auto` says what it found there); `None` for other tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
    /// The device the run trained on (`cpu` when the preset's device did not open).
    pub device: crate::device::DeviceName,
    /// Why the run trained on the CPU instead of the preset's device, if it did.
    #[serde(default)]
    pub device_notice: Option<String>,
    /// `train.precision` (runs saved before it existed trained in f32).
    #[serde(default)]
    pub precision: crate::ops::Precision,
    pub n_params: usize,
    /// The model's recurrent state in floats at the task's length (`None`: it has none, or
    /// the run predates it), and in zoology's units (4 × its per-mixer formulas), the x axis
    /// of the recall-vs-state plots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_floats: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_zoology: Option<usize>,
    /// Models in the batched computation this run trained in, when it trained as a replica of
    /// a group (see `train::replicas`); its results are its own either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<usize>,
    pub steps: usize,
    pub total_steps: usize,
    pub epoch: f64,
    pub elapsed_secs: f64,
    pub last_loss: Option<f32>,
    /// `train.metric`, the accuracy of `last_accuracy` and `best_accuracy` (runs saved before
    /// it existed: micro).
    #[serde(default)]
    pub metric: super::Metric,
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
        /// Why the run trains on the CPU instead of the preset's device, if it does.
        device_notice: Option<String>,
        /// What `train.precision` does on this device when it is not what its name says
        /// ([`crate::device::precision_note`]).
        precision_note: Option<String>,
        /// The text a language model trains on ([`Summary::corpus`]).
        corpus: Option<String>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A diverging run's NaN and infinite losses used to be written as `null`, and the reader
    /// dropped those lines; they now round-trip.
    #[test]
    fn non_finite_metrics_round_trip() {
        let step = MetricRecord::Step(StepRecord {
            step: 3,
            epoch: 0.5,
            loss: f32::NAN,
            lr: 1e-3,
            grad_norm: f64::INFINITY,
            tokens_per_s: 10.0,
            elapsed_secs: 1.0,
        });
        let line = serde_json::to_string(&step).unwrap();
        assert!(
            line.contains(r#""loss":"NaN""#) && line.contains(r#""grad_norm":"inf""#),
            "{line}"
        );
        let MetricRecord::Step(back) = serde_json::from_str(&line).unwrap() else {
            panic!("not a step: {line}");
        };
        assert!(back.loss.is_nan() && back.grad_norm == f64::INFINITY);
        let eval = MetricRecord::Eval(EvalRecord {
            step: 3,
            epoch: 0.5,
            accuracy: 0.25,
            macro_accuracy: Some(0.5),
            loss: f64::NEG_INFINITY,
            elapsed_secs: 1.0,
        });
        let line = serde_json::to_string(&eval).unwrap();
        assert_eq!(serde_json::from_str::<MetricRecord>(&line).unwrap(), eval);
        let finite =
            r#"{"kind":"eval","step":1,"epoch":1.0,"accuracy":0.5,"loss":0.1,"elapsed_secs":2.0}"#;
        let MetricRecord::Eval(read) = serde_json::from_str(finite).unwrap() else {
            panic!("not an eval");
        };
        assert_eq!(read.loss, 0.1);
        let old = finite.replace("0.1", "null");
        let MetricRecord::Eval(read) = serde_json::from_str(&old).unwrap() else {
            panic!("not an eval");
        };
        assert!(read.loss.is_nan(), "older files' null reads as NaN");
    }

    /// Runs saved before `device_notice` existed still open.
    #[test]
    fn a_summary_without_device_notice_reads_as_none() {
        let json = r#"{"name":"r","status":"completed","mechanism":"softmax","encoding":"rope",
            "task":"mqar","device":"cpu","n_params":10,"steps":4,"total_steps":4,"epoch":1.0,
            "elapsed_secs":0.5,"last_loss":1.5,"last_accuracy":0.25,"best_accuracy":0.25,
            "time_to_target_secs":null,"tokens_per_s":100.0,"error":null,"attnlab_version":"0.1.0"}"#;
        let summary: Summary = serde_json::from_str(json).unwrap();
        assert_eq!(summary.device_notice, None);
        assert_eq!(summary.precision, crate::ops::Precision::F32);
        assert_eq!(summary.status, RunStatus::Completed);
    }

    #[test]
    fn statuses_read_as_words_with_the_failure_reason() {
        assert_eq!(
            RunStatus::TargetReached.explain(None),
            "reached target accuracy"
        );
        assert_eq!(RunStatus::Stopped.explain(Some("ignored")), "stopped");
        assert_eq!(
            RunStatus::Failed.explain(Some("out of memory")),
            "failed: out of memory"
        );
        assert_eq!(RunStatus::Failed.explain(None), "failed");
    }
}
