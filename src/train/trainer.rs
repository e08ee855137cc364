//! The training loop itself: no threads, no files. `run` and the benchmark drive it.

use candle_core::{D, DType, Device, Tensor, Var};

use super::optim::{AdamW, learning_rate};
use crate::model::Transformer;
use crate::ops::{cross_entropy, mix_seed};
use crate::params::Params;
use crate::preset::Preset;
use crate::rng::{self, AttnRng, SliceRandom};
use crate::tasks::{Batch, Dataset};
use crate::{Error, Result};

/// Tokens per forward pass when evaluating. Larger passes were measured slower on the CPU
/// (1,000 MQAR rows of 64 tokens: 0.62 s in passes of 256 rows, 0.35 s in passes of 64):
/// their activations outgrow the caches.
const EVAL_TOKENS: usize = 4096;

/// Result of one optimiser step.
#[derive(Clone, Copy, Debug)]
pub struct StepStats {
    pub loss: f32,
    pub lr: f64,
    pub grad_norm: f64,
}

/// Result of an evaluation.
#[derive(Clone, Copy, Debug)]
pub struct EvalStats {
    pub accuracy: f64,
    pub loss: f64,
}

/// A model, its optimiser and its data, advanced one step at a time.
pub struct Trainer {
    preset: Preset,
    device: Device,
    /// The device actually used and why it differs from the preset's, see [`crate::device::Opened`].
    device_name: String,
    device_notice: Option<String>,
    params: Params,
    model: Transformer,
    optimizer: AdamW,
    train: Dataset,
    test: Dataset,
    order: Vec<usize>,
    shuffle: AttnRng,
    step: usize,
    steps_per_epoch: usize,
    total_steps: usize,
}

impl Trainer {
    /// Builds model, optimiser and datasets for a validated preset.
    pub fn new(preset: &Preset) -> Result<Self> {
        let opened = crate::device::open_or_fallback(&preset.train.device)?;
        let device = opened.device;
        crate::device::use_tf32(
            &device,
            preset.train.precision == crate::ops::Precision::Tf32,
        );
        let params = Params::new(preset.train.seed, &device);
        let model = preset.build_model(&params)?;
        let vars: Vec<Var> = params.vars().into_iter().map(|(_, v)| v).collect();
        let optimizer = AdamW::new(vars, &preset.train)?;
        let (train, test) = preset.task.datasets()?;
        let steps_per_epoch = preset.train.steps_per_epoch(train.len());
        Ok(Self {
            total_steps: preset.train.total_steps(train.len()),
            steps_per_epoch,
            order: Vec::new(),
            shuffle: rng::stream(preset.train.seed, "shuffle"),
            step: 0,
            preset: preset.clone(),
            device,
            device_name: opened.name,
            device_notice: opened.notice,
            params,
            model,
            optimizer,
            train,
            test,
        })
    }

    pub fn preset(&self) -> &Preset {
        &self.preset
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The name of the device training runs on (`cpu` when the preset's did not open).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Why training runs on the CPU instead of the preset's device, if it does.
    pub fn device_notice(&self) -> Option<&str> {
        self.device_notice.as_deref()
    }

    pub fn test_set(&self) -> &Dataset {
        &self.test
    }

    /// Steps done so far.
    pub fn step(&self) -> usize {
        self.step
    }

    pub fn total_steps(&self) -> usize {
        self.total_steps
    }

    pub fn steps_per_epoch(&self) -> usize {
        self.steps_per_epoch
    }

    /// Fractional epochs done.
    pub fn epoch(&self) -> f64 {
        self.step as f64 / self.steps_per_epoch as f64
    }

    /// Tokens in one training batch.
    pub fn tokens_per_step(&self) -> usize {
        self.preset.train.batch_size * self.train.seq_len
    }

    /// Rows of the next training batch; the order is reshuffled at each epoch.
    fn next_rows(&mut self) -> Vec<usize> {
        let batch = self.preset.train.batch_size;
        let within = (self.step % self.steps_per_epoch) * batch;
        if within == 0 {
            self.order = (0..self.train.len()).collect();
            self.order.shuffle(&mut self.shuffle);
        }
        self.order[within..within + batch].to_vec()
    }

    /// The dropout masks' seed for the next step: a function of the run's seed and the
    /// step, so a run repeats.
    fn step_seed(&self) -> u64 {
        mix_seed(mix_seed(self.preset.train.seed) ^ self.step as u64)
    }

    /// Mean cross-entropy of a batch at its scored positions, as the next training step
    /// computes it (with the model's dropout).
    pub fn batch_loss(&self, batch: &Batch) -> Result<Tensor> {
        let logits = self
            .model
            .train_logits(&batch.inputs, &batch.rows, self.step_seed())?;
        cross_entropy(&logits, &batch.targets)
    }

    /// Nodes in the autograd graph of one training batch (the forward ops that lead to a
    /// parameter): what a step computes, counted the same on every device. On a GPU each is a
    /// kernel launch or more, and its backward about as many again.
    pub fn graph_nodes(&self) -> Result<usize> {
        let rows: Vec<usize> = (0..self.preset.train.batch_size.min(self.train.len())).collect();
        let batch = self.train.batch(&rows, &self.device)?;
        Ok(self.batch_loss(&batch)?.sorted_nodes().len())
    }

    /// One optimiser step. A NaN or infinite loss is an error and leaves the parameters as they were.
    ///
    /// The step runs on a thread of rayon's pool: each of its parallel ops (matrix products,
    /// fused kernels) then starts on the calling worker, which the other threads help, instead
    /// of being handed to the pool while the caller sleeps (3–6 % of a step, measured).
    pub fn train_step(&mut self) -> Result<StepStats> {
        rayon::scope(|_| self.step_in_pool())
    }

    fn step_in_pool(&mut self) -> Result<StepStats> {
        let rows = self.next_rows();
        let batch = self.train.batch(&rows, &self.device)?;
        let loss = self.batch_loss(&batch)?;
        let loss_value = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if !loss_value.is_finite() {
            return Err(Error::NonFiniteLoss {
                step: self.step + 1,
                loss: loss_value,
            });
        }
        let grads = loss.backward()?;
        let grad_norm = self.optimizer.grad_norm(&grads)?;
        let clip = self.preset.train.grad_clip;
        let scale = if clip > 0.0 && grad_norm > clip {
            clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let lr = learning_rate(&self.preset.train, self.step, self.total_steps);
        self.optimizer.step(&grads, lr, scale)?;
        self.step += 1;
        Ok(StepStats {
            loss: loss_value,
            lr,
            grad_norm,
        })
    }

    /// Accuracy and loss over the whole test split (on rayon's pool, like a step).
    pub fn evaluate(&self) -> Result<EvalStats> {
        rayon::scope(|_| self.evaluate_in_pool())
    }

    fn evaluate_in_pool(&self) -> Result<EvalStats> {
        let (mut correct, mut loss_sum, mut scored) = (0f64, 0f64, 0usize);
        let rows: Vec<usize> = (0..self.test.len()).collect();
        let rows_per_pass = (EVAL_TOKENS / self.test.seq_len.max(1)).max(1);
        for chunk in rows.chunks(rows_per_pass) {
            let batch = self.test.batch(chunk, &self.device)?;
            if batch.n_scored == 0 {
                continue;
            }
            let logits = self.model.logits_at(&batch.inputs, &batch.rows)?.detach();
            let loss = cross_entropy(&logits, &batch.targets)?;
            loss_sum += f64::from(loss.to_scalar::<f32>()?) * batch.n_scored as f64;
            let hits = logits
                .argmax(D::Minus1)?
                .eq(&batch.targets)?
                .to_dtype(DType::F32)?
                .sum_all()?
                .to_scalar::<f32>()?;
            correct += f64::from(hits);
            scored += batch.n_scored;
        }
        let scored = scored.max(1) as f64;
        Ok(EvalStats {
            accuracy: correct / scored,
            loss: loss_sum / scored,
        })
    }

    /// Attention of every layer for test rows `rows`: per layer, `Some((B, H, Tq, Tk))` for
    /// attention layers and `None` for convolutions.
    pub fn attention_of(&self, rows: &[usize]) -> Result<Vec<Option<Tensor>>> {
        let batch = self.test.batch(rows, &self.device)?;
        let forward = self.model.forward(&batch.inputs)?;
        forward
            .attention
            .into_iter()
            .map(|layer| layer.map(|a| Ok(a.weights.detach())).transpose())
            .collect()
    }
}
