//! The `[train]` section of a preset: optimiser, schedule, stopping, evaluation cadence, seed,
//! device and precision. It lives with the preset, below the training code that reads it, so
//! the layers stay one-way (preset → train never the other way).

use serde::{Deserialize, Serialize};

use crate::error::number;
use crate::tasks::TaskSpec;
use crate::{Error, Result};

/// How the learning rate evolves after warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Cosine decay from `lr` to `min_lr` over the run (PyTorch's `CosineAnnealingLR` per step).
    #[default]
    Cosine,
    /// The same cosine stepped once an epoch, constant within one: `CosineAnnealingLR(T_max =
    /// epochs)` stepped per epoch, as MAD's Lightning module does (Lightning's default interval);
    /// after a warm-up, from the epoch it ends in.
    CosineEpochs,
    /// `lr` throughout.
    Constant,
}

/// Which test accuracy is a run's headline: what `train.target_accuracy` stops on and what
/// `summary.json`'s last and best accuracies hold. Both are recorded at every evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// The fraction of scored positions predicted exactly (zoology's MQAR accuracy).
    #[default]
    Micro,
    /// Per target class the fraction predicted exactly, averaged over the classes seen:
    /// torchmetrics' `MulticlassAccuracy` default, MAD's metric.
    Macro,
}

impl Metric {
    /// As presets spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Micro => "micro",
            Self::Macro => "macro",
        }
    }
}

/// The largest `train.weight_decay`: more shrinks every weight to noise within a few steps
/// at any useful learning rate (the usual values are 0 to 0.1; MAD's grid goes to 0.1).
const MAX_WEIGHT_DECAY: f64 = 10.0;

/// The smallest `train.eps`, far below any that training uses (1e-8 by default) and well
/// within f32's normal range.
const MIN_EPS: f64 = 1e-30;

/// The `[train]` section of a preset. Defaults are the benchmark's (and PyTorch's) settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Decoupled weight decay (AdamW), applied to every parameter as PyTorch's reference does.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Passes over the training set; the run stops earlier at `max_steps` or the target accuracy.
    pub epochs: usize,
    /// Total optimiser steps; when absent, `epochs × (train_examples / batch_size)`.
    pub max_steps: Option<usize>,
    /// Linear warm-up from 0 to `lr` over these steps.
    pub warmup_steps: usize,
    pub schedule: Schedule,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    /// Clip the global gradient norm to this value; 0 turns clipping off.
    pub grad_clip: f64,
    /// Evaluate every this many steps; 0 means once per epoch (zoology's protocol).
    pub eval_every: usize,
    /// Stop once test accuracy reaches this value (zoology stops at 0.99, MAD at 0.999); 0
    /// never stops early.
    pub target_accuracy: f64,
    /// Which accuracy the target and the summary read: `micro` or `macro` (MAD's).
    pub metric: Metric,
    /// Seed of the initialisation and of the data order.
    pub seed: u64,
    /// `cpu`, `cuda:N` or `metal`.
    pub device: crate::device::DeviceName,
    /// How matrix products compute: `f32`, `tf32` (CUDA tensor cores) or `bf16` (mixed
    /// precision with f32 master weights); see [`crate::ops::Precision`].
    pub precision: crate::ops::Precision,
    /// Also write a TensorBoard event file (`<run>/tensorboard/`): scalars, attention maps and
    /// the preset as HParams, so `tensorboard --logdir runs/` shows the run.
    pub tensorboard: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            batch_size: 64,
            lr: 1e-3,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            epochs: 40,
            max_steps: None,
            warmup_steps: 0,
            schedule: Schedule::Cosine,
            min_lr: 0.0,
            grad_clip: 0.0,
            eval_every: 0,
            target_accuracy: 0.99,
            metric: Metric::Micro,
            seed: 0,
            device: crate::device::DeviceName::Cpu,
            precision: crate::ops::Precision::F32,
            tensorboard: true,
        }
    }
}

impl TrainConfig {
    /// Optimiser steps in one pass over `train_examples` rows (the last partial batch is dropped).
    pub fn steps_per_epoch(&self, train_examples: usize) -> usize {
        (train_examples / self.batch_size.max(1)).max(1)
    }

    /// Saturating: [`Self::validate`] refuses a product that overflows, so only an unvalidated
    /// preset sees `usize::MAX`.
    pub fn total_steps(&self, train_examples: usize) -> usize {
        self.max_steps.unwrap_or(
            self.epochs
                .saturating_mul(self.steps_per_epoch(train_examples)),
        )
    }

    /// Steps between evaluations.
    pub fn eval_interval(&self, train_examples: usize) -> usize {
        match self.eval_every {
            0 => self.steps_per_epoch(train_examples),
            n => n,
        }
    }

    /// Checks ranges; errors name `train.…`.
    pub fn validate(&self, task: &TaskSpec) -> Result<()> {
        let bad = |key: &str, value: &dyn ToString, why: &str| {
            Err(Error::preset(
                format!("train.{key}"),
                value.to_string(),
                why,
            ))
        };
        let train_examples = task.train_examples();
        if self.batch_size == 0 || self.batch_size > train_examples {
            return bad(
                "batch_size",
                &self.batch_size,
                &format!("must be in 1..={train_examples} (task.train_examples)"),
            );
        }
        if !(self.lr > 0.0 && self.lr <= 10.0) {
            return bad("lr", &number(self.lr), "must be in (0, 10]");
        }
        if !(0.0..=MAX_WEIGHT_DECAY).contains(&self.weight_decay) {
            return bad(
                "weight_decay",
                &number(self.weight_decay),
                &format!("must be in [0, {MAX_WEIGHT_DECAY}]"),
            );
        }
        if self.lr * self.weight_decay >= 1.0 {
            return bad(
                "weight_decay",
                &number(self.weight_decay),
                &format!(
                    "times train.lr = {} must be below 1: each step multiplies the weights by \
                     1 − lr·weight_decay",
                    self.lr
                ),
            );
        }
        for (key, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return bad(key, &number(beta), "must be in [0, 1)");
            }
        }
        if !(MIN_EPS..1.0).contains(&self.eps) {
            return bad(
                "eps",
                &number(self.eps),
                &format!(
                    "must be in [{MIN_EPS:e}, 1): far below any ε training uses and inside \
                     f32's normal range (5e-324 rounds to 0 in f32, and a parameter without \
                     gradient then takes 0/0)"
                ),
            );
        }
        if self.epochs == 0 {
            return bad("epochs", &self.epochs, "must be ≥ 1");
        }
        if self.max_steps == Some(0) {
            return bad(
                "max_steps",
                &0,
                "must be ≥ 1 (leave it out to train for `epochs`)",
            );
        }
        let per_epoch = self.steps_per_epoch(train_examples);
        if self.max_steps.is_none() && self.epochs.checked_mul(per_epoch).is_none() {
            return bad(
                "epochs",
                &self.epochs,
                &format!(
                    "times {per_epoch} steps per epoch overflows: at most {}",
                    usize::MAX / per_epoch
                ),
            );
        }
        let total = self.total_steps(train_examples);
        if self.warmup_steps >= total {
            return bad(
                "warmup_steps",
                &self.warmup_steps,
                &format!("must be smaller than the run's {total} steps"),
            );
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            return bad(
                "min_lr",
                &number(self.min_lr),
                &format!("must be in [0, train.lr = {}]", self.lr),
            );
        }
        if !(self.grad_clip >= 0.0 && self.grad_clip.is_finite()) {
            return bad(
                "grad_clip",
                &number(self.grad_clip),
                "must be ≥ 0 (0 turns clipping off)",
            );
        }
        if !(0.0..=1.0).contains(&self.target_accuracy) {
            return bad(
                "target_accuracy",
                &number(self.target_accuracy),
                "must be in [0, 1] (0 never stops early)",
            );
        }
        self.device
            .check()
            .map_err(|e| Error::preset("train.device", self.device, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `epochs × steps per epoch` used to wrap around in release builds (4 steps, then
    /// "completed") and panic in debug ones.
    #[test]
    fn an_overflowing_number_of_steps_is_refused() {
        let task = TaskSpec::default();
        let config = TrainConfig {
            epochs: 4_611_686_018_427_387_905,
            ..TrainConfig::default()
        };
        let err = config.validate(&task).unwrap_err().to_string();
        assert!(
            err.contains("train.epochs = 4611686018427387905") && err.contains("overflows"),
            "{err}"
        );
        let capped = TrainConfig {
            max_steps: Some(10),
            ..config
        };
        assert!(capped.validate(&task).is_ok(), "max_steps bounds the run");
    }
}
