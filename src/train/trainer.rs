//! The training loop itself: no threads, no files. `run` and the benchmark drive it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, DType, Device, Tensor, Var};

use super::optim::{AdamW, Update, learning_rate};
use crate::model::Transformer;
use crate::ops::{cross_entropy, cross_entropy_groups, mix_seed};
use crate::params::Params;
use crate::preset::{Metric, Preset};
use crate::rng::{self, AttnRng, SliceRandom};
use crate::tasks::{Batch, Dataset};
use crate::{Error, Result};

/// Tokens per forward pass when evaluating. Larger passes were measured slower on the CPU
/// (1,000 MQAR rows of 64 tokens: 0.62 s in passes of 256 rows, 0.35 s in passes of 64):
/// their activations outgrow the caches.
const EVAL_TOKENS: usize = 4096;

/// The key of the step in an optimiser state file ([`Trainer::save_optimizer`]): no
/// parameter name has a leading underscore.
pub const STEP_KEY: &str = "__step__";

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
    /// Micro: the fraction of scored positions predicted exactly.
    pub accuracy: f64,
    /// Macro: per target class, the fraction of its positions predicted exactly, averaged
    /// over the classes ([`ClassCounts::macro_accuracy`], MAD's metric).
    pub macro_accuracy: f64,
    pub loss: f64,
}

impl EvalStats {
    /// The accuracy `metric` names (NaN macro accuracy, no class seen, reaches no target).
    pub fn headline(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Micro => self.accuracy,
            Metric::Macro => self.macro_accuracy,
        }
    }
}

/// Per class of a classification, over a whole split: how often it was the target, how often
/// predicted, how often both. What torchmetrics' `MulticlassAccuracy` accumulates.
#[derive(Clone, Debug, Default)]
pub struct ClassCounts {
    targets: Vec<u64>,
    predicted: Vec<u64>,
    hits: Vec<u64>,
}

impl ClassCounts {
    /// Counts `predictions` against `targets` (equal lengths).
    pub fn add(&mut self, predictions: &[u32], targets: &[u32]) {
        let classes = predictions
            .iter()
            .chain(targets)
            .map(|&c| c as usize + 1)
            .max();
        let n = classes.unwrap_or(0).max(self.targets.len());
        for counts in [&mut self.targets, &mut self.predicted, &mut self.hits] {
            counts.resize(n, 0);
        }
        for (&p, &t) in predictions.iter().zip(targets) {
            self.targets[t as usize] += 1;
            self.predicted[p as usize] += 1;
            self.hits[t as usize] += u64::from(p == t);
        }
    }

    /// The fraction of all positions predicted exactly (0 when none were counted).
    pub fn micro_accuracy(&self) -> f64 {
        let targets: u64 = self.targets.iter().sum();
        self.hits.iter().sum::<u64>() as f64 / targets.max(1) as f64
    }

    /// torchmetrics' `MulticlassAccuracy(average="macro")`, MAD's metric: each class's recall
    /// tp / (tp + fn), averaged over the classes that were a target or a prediction (a class
    /// only ever predicted counts as 0; one never seen at all is left out). NaN when empty.
    pub fn macro_accuracy(&self) -> f64 {
        let seen: Vec<f64> = (0..self.targets.len())
            .filter(|&c| self.targets[c] + self.predicted[c] > 0)
            .map(|c| match self.targets[c] {
                0 => 0.0,
                n => self.hits[c] as f64 / n as f64,
            })
            .collect();
        seen.iter().sum::<f64>() / seen.len() as f64
    }
}

/// What one training step did to one replica.
#[derive(Debug)]
pub enum ReplicaStep {
    Trained(StepStats),
    /// Its loss was NaN or infinite: it is frozen where it was before the step.
    Diverged(Error),
    /// Frozen before this step (finished or diverged): its parameters did not change.
    Frozen,
}

/// One model of a trainer: its preset, its data order and whether it still trains.
struct Replica {
    preset: Preset,
    order: Vec<usize>,
    shuffle: AttnRng,
    active: bool,
}

/// Models, their optimiser and their data, advanced one step at a time: one model, or R
/// replicas of one shape trained as one batched computation (see `params.rs` and
/// [`super::replicas`]). A replica trains exactly as it would alone (its own initialisation,
/// data order, dropout masks, learning rate and optimiser state); its batch is its block of
/// the stacked batch and its loss is its own term of the summed loss, whose gradient with
/// respect to its parameters is its lone gradient.
pub struct Trainer {
    replicas: Vec<Replica>,
    /// The replicas the model computes, in the order of its stacked dimension: all of them
    /// at first, the active ones after others froze ([`Self::freeze`]).
    computed: Vec<usize>,
    device: Device,
    /// The device actually used and why it differs from the preset's, see [`crate::device::Opened`].
    device_name: crate::device::DeviceName,
    device_notice: Option<String>,
    params: Params,
    model: Transformer,
    optimizer: AdamW,
    train: Dataset,
    test: Dataset,
    step: usize,
    steps_per_epoch: usize,
    total_steps: usize,
}

impl Trainer {
    /// Builds model, optimiser and datasets for a validated preset.
    pub fn new(preset: &Preset) -> Result<Self> {
        Self::group(std::slice::from_ref(preset))
    }

    /// Builds R replicas for validated presets of one shape ([`super::replicas::same_shape`]);
    /// one preset gives a lone model, without the replica dimension.
    pub fn group(presets: &[Preset]) -> Result<Self> {
        let Some(first) = presets.first() else {
            return Err(Error::argument(
                "number of presets",
                0,
                "is too few: a replica group needs at least one",
            ));
        };
        if let Some(other) = presets
            .iter()
            .find(|p| !super::replicas::same_shape(first, p))
        {
            return Err(Error::unsupported(
                format!("grouping {} and {}", first.name, other.name),
                format!(
                    "they differ in more than the per-run settings ({}) and cannot train as \
                     replicas",
                    super::replicas::PER_RUN.join(", ")
                ),
            ));
        }
        let opened = first.train.device.open_or_fallback()?;
        let device = opened.device;
        if let Some(free) = crate::device::free_gpu_bytes(&device) {
            first.check_state_fits_on_gpu(presets.len(), first.train.device, free as f64)?;
        }
        crate::device::use_precision(&device, first.train.precision);
        let seeds: Vec<u64> = presets.iter().map(|p| p.train.seed).collect();
        let params = match presets.len() {
            1 => Params::new(seeds[0], &device),
            _ => Params::replicated(&seeds, &device),
        };
        let model = first.build_model(&params)?;
        let vars: Vec<Var> = params.vars().into_iter().map(|(_, v)| v).collect();
        let configs: Vec<_> = presets.iter().map(|p| p.train.clone()).collect();
        let optimizer = match presets.len() {
            1 => AdamW::new(vars, &configs[0])?,
            _ => AdamW::replicated(vars, &configs)?,
        };
        let (train, test) = first.task.datasets()?;
        Ok(Self {
            total_steps: first.train.total_steps(train.len()),
            steps_per_epoch: first.train.steps_per_epoch(train.len()),
            replicas: presets
                .iter()
                .map(|preset| Replica {
                    order: Vec::new(),
                    shuffle: rng::stream(preset.train.seed, "shuffle"),
                    active: true,
                    preset: preset.clone(),
                })
                .collect(),
            computed: (0..presets.len()).collect(),
            step: 0,
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

    /// The preset of the (first) model.
    pub fn preset(&self) -> &Preset {
        &self.replicas[0].preset
    }

    /// The preset of replica `r`.
    pub fn replica_preset(&self, r: usize) -> &Preset {
        &self.replicas[r].preset
    }

    /// Models trained together (1 for a lone model).
    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Stops training replica `r` (it reached its target): its parameters stay as they are,
    /// and from the next step on the model no longer computes it.
    pub fn freeze(&mut self, r: usize) {
        self.replicas[r].active = false;
    }

    /// Drops the frozen replicas from the stacked model and its optimiser, so that a step
    /// costs what the active replicas cost.
    fn compact(&mut self) -> Result<()> {
        let keep: Vec<usize> = (0..self.computed.len())
            .filter(|&slot| self.replicas[self.computed[slot]].active)
            .collect();
        if keep.len() == self.computed.len() || self.params.replicas().is_none() {
            return Ok(());
        }
        self.computed = keep.iter().map(|&slot| self.computed[slot]).collect();
        if keep.is_empty() {
            return Ok(());
        }
        self.params = self.params.select_replicas(&keep)?;
        self.model = self.preset().build_model(&self.params)?;
        let vars = self.params.vars().into_iter().map(|(_, v)| v).collect();
        self.optimizer.select_replicas(&keep, vars)
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
    pub fn device_name(&self) -> crate::device::DeviceName {
        self.device_name
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

    /// Tokens in one model's training batch.
    pub fn tokens_per_step(&self) -> usize {
        self.preset().train.batch_size * self.train.seq_len
    }

    /// Writes replica `r`'s parameters (the model's, when alone) as a lone model's checkpoint.
    /// A parameter that is NaN, infinite or exploded ([`crate::params::EXPLODED`]; an update
    /// can diverge while the loss before it was finite) is [`Error::Diverged`] and writes
    /// nothing, so the last checkpoint stays usable.
    pub fn save_checkpoint(&self, r: usize, path: &Path) -> Result<()> {
        let replica = self
            .params
            .replicas()
            .map(|_| self.slot_of(r))
            .transpose()?;
        if let Some((name, why)) = self.params.first_unusable(replica)? {
            return Err(Error::Diverged {
                step: self.step,
                what: format!("parameter {name} {why}"),
                kept: None,
            });
        }
        match replica {
            Some(slot) => self.params.save_replica(slot, path, Some(self.step)),
            None => self.params.save(path, Some(self.step)),
        }
    }

    /// Replica `r`'s position in the stacked model and optimiser.
    fn slot_of(&self, r: usize) -> Result<usize> {
        self.computed
            .iter()
            .position(|&c| c == r)
            .ok_or_else(|| Error::Internal(format!("replica {r} is frozen and no longer held")))
    }

    /// Writes replica `r`'s optimiser state (AdamW's moments under its parameters' names, and
    /// the step as [`STEP_KEY`]) to a safetensors file, atomically: with its checkpoint, what
    /// [`Self::restore`] needs to continue the run exactly.
    pub fn save_optimizer(&self, r: usize, path: &Path) -> Result<()> {
        let moments = self.optimizer.replica_moments(self.slot_of(r)?);
        let mut tensors: HashMap<String, Tensor> = self
            .params
            .vars()
            .into_iter()
            .map(|(name, _)| name)
            .zip(moments)
            .collect();
        let step = Tensor::new(&[self.step as i64], &Device::Cpu)?;
        tensors.insert(STEP_KEY.into(), step);
        crate::params::save_tensors(&tensors, path, Some(self.step))
    }

    /// Continues a lone model from a checkpoint (`weights`) and its optimiser state
    /// (`optimizer`, see [`Self::save_optimizer`]): parameters, moments and step; the data
    /// order is replayed from the shuffle stream, the dropout masks and the learning rate
    /// follow from the step. A replica group cannot be restored.
    pub fn restore(&mut self, weights: &Path, optimizer: &Path) -> Result<()> {
        if self.replicas() > 1 {
            return Err(Error::unsupported(
                "resuming a replica group",
                "only a lone run can be resumed",
            ));
        }
        self.params.load(weights)?;
        let (moments, step) = self.read_optimizer(optimizer)?;
        self.optimizer.restore(moments, step)?;
        self.step = step;
        let epochs_started = step.div_ceil(self.steps_per_epoch);
        for _ in 0..epochs_started {
            self.reshuffle(0);
        }
        Ok(())
    }

    /// The moments (in the order of the parameters) and the step of an optimiser state file,
    /// checked against this model: every parameter present with its size, the step within
    /// the run.
    fn read_optimizer(&self, path: &Path) -> Result<(Vec<Tensor>, usize)> {
        let bad = |message: String| Error::RunDir {
            message,
            path: path.to_path_buf(),
        };
        let saved = crate::params::load_tensors(path, "optimizer state", &self.device)?;
        let step = saved
            .get(STEP_KEY)
            .and_then(|t| t.to_vec1::<i64>().ok())
            .and_then(|v| usize::try_from(*v.first()?).ok())
            .ok_or_else(|| bad(format!("optimizer state has no step ({STEP_KEY})")))?;
        if step > self.total_steps {
            return Err(bad(format!(
                "the checkpoint is at step {step}, past the preset's {} steps",
                self.total_steps
            )));
        }
        let moments = self
            .params
            .vars()
            .iter()
            .map(|(name, var)| match saved.get(name) {
                Some(m) if m.elem_count() == 2 * var.elem_count() => Ok(m.clone()),
                Some(m) => Err(bad(format!(
                    "optimizer state of {name} has {} values, the preset's model needs {}",
                    m.elem_count(),
                    2 * var.elem_count()
                ))),
                None => Err(bad(format!("optimizer state has no parameter {name}"))),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((moments, step))
    }

    /// Draws replica `r`'s data order for a new epoch from its shuffle stream.
    fn reshuffle(&mut self, r: usize) {
        let replica = &mut self.replicas[r];
        replica.order = (0..self.train.len()).collect();
        replica.order.shuffle(&mut replica.shuffle);
    }

    /// Rows of every computed replica's next training batch, replica after replica; each
    /// replica's order is reshuffled at each epoch from its own stream.
    fn next_rows(&mut self) -> Vec<usize> {
        let within = (self.step % self.steps_per_epoch) * self.preset().train.batch_size;
        let mut rows = Vec::new();
        for r in self.computed.clone() {
            if within == 0 {
                self.reshuffle(r);
            }
            let replica = &self.replicas[r];
            let batch = replica.preset.train.batch_size;
            rows.extend_from_slice(&replica.order[within..within + batch]);
        }
        rows
    }

    /// The dropout masks' seed of each replica for the next step: a function of its seed and
    /// the step, so a run repeats, alone or in a group.
    fn step_seeds(&self) -> Vec<u64> {
        let step = self.step as u64;
        self.computed
            .iter()
            .map(|&r| mix_seed(mix_seed(self.replicas[r].preset.train.seed) ^ step))
            .collect()
    }

    /// Each computed replica's mean cross-entropy over its block of a stacked batch, as the
    /// next training step computes it (with the model's dropout): (computed replicas).
    fn replica_losses(&self, batch: &Batch) -> Result<Tensor> {
        let logits = self
            .model
            .train_logits(&batch.inputs, &batch.rows, &self.step_seeds())?;
        cross_entropy_groups(&logits, &batch.targets, self.computed.len())
    }

    /// Mean cross-entropy of a batch at its scored positions, as the next training step
    /// computes it (with the model's dropout); summed over replicas.
    pub fn batch_loss(&self, batch: &Batch) -> Result<Tensor> {
        Ok(self.replica_losses(batch)?.sum_all()?)
    }

    /// Nodes in the autograd graph of one training batch (the forward ops that lead to a
    /// parameter): what a step computes, counted the same on every device. On a GPU each is a
    /// kernel launch or more, and its backward about as many again.
    pub fn graph_nodes(&self) -> Result<usize> {
        let rows: Vec<usize> = (0..self.preset().train.batch_size.min(self.train.len())).collect();
        let batch = self
            .train
            .batch(&self.for_each_replica(&rows), &self.device)?;
        Ok(self.batch_loss(&batch)?.sorted_nodes().len())
    }

    /// `rows` once for each computed replica, replica after replica: one stacked batch.
    fn for_each_replica(&self, rows: &[usize]) -> Vec<usize> {
        rows.repeat(self.computed.len())
    }

    /// One optimiser step of a lone model. A NaN or infinite loss is an error and leaves the
    /// parameters as they were.
    pub fn train_step(&mut self) -> Result<StepStats> {
        match self.train_step_replicas()?.swap_remove(0) {
            ReplicaStep::Trained(stats) => Ok(stats),
            ReplicaStep::Diverged(error) => Err(error),
            ReplicaStep::Frozen => Err(Error::Internal(
                "the model is frozen: it diverged or reached its target".into(),
            )),
        }
    }

    /// One optimiser step of every active replica. A replica whose loss is NaN or infinite is
    /// frozen as it was before the step; the others train on.
    ///
    /// The step runs on a thread of rayon's pool: each of its parallel ops (matrix products,
    /// fused kernels) then starts on the calling worker, which the other threads help, instead
    /// of being handed to the pool while the caller sleeps (3–6 % of a step, measured).
    pub fn train_step_replicas(&mut self) -> Result<Vec<ReplicaStep>> {
        rayon::scope(|_| self.step_in_pool())
    }

    fn step_in_pool(&mut self) -> Result<Vec<ReplicaStep>> {
        self.compact()?;
        let mut outcomes: Vec<ReplicaStep> =
            (0..self.replicas()).map(|_| ReplicaStep::Frozen).collect();
        if self.computed.is_empty() {
            self.step += 1;
            return Ok(outcomes);
        }
        let rows = self.next_rows();
        let batch = self.train.batch(&rows, &self.device)?;
        let losses = self.replica_losses(&batch)?;
        let values = losses.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        // The computed replicas (their slots) that train this step.
        let mut training = Vec::new();
        for (slot, &loss) in values.iter().enumerate() {
            let r = self.computed[slot];
            if !self.replicas[r].active {
                continue;
            }
            if loss.is_finite() {
                training.push(slot);
            } else {
                self.replicas[r].active = false;
                let step = self.step + 1;
                outcomes[r] = ReplicaStep::Diverged(Error::Diverged {
                    step,
                    what: format!("the loss is {loss}"),
                    kept: None,
                });
            }
        }
        if !training.is_empty() {
            // The training replicas' losses only: a diverged one's NaN stays out of the sum.
            let summed = if training.len() == values.len() {
                losses
            } else {
                let slots: Vec<u32> = training.iter().map(|&s| s as u32).collect();
                losses.index_select(&Tensor::new(slots.as_slice(), losses.device())?, 0)?
            };
            let grads = summed.sum_all()?.backward()?;
            let norms = self.optimizer.grad_norms(&grads)?;
            let mut updates = vec![None; self.computed.len()];
            for &slot in &training {
                let r = self.computed[slot];
                let train = &self.replicas[r].preset.train;
                let clip = train.grad_clip;
                let grad_scale = if clip > 0.0 && norms[slot] > clip {
                    clip / (norms[slot] + 1e-6)
                } else {
                    1.0
                };
                let lr = learning_rate(train, self.step, (self.total_steps, self.steps_per_epoch));
                updates[slot] = Some(Update { lr, grad_scale });
                outcomes[r] = ReplicaStep::Trained(StepStats {
                    loss: values[slot],
                    lr,
                    grad_norm: norms[slot],
                });
            }
            self.optimizer.step_replicas(&grads, &updates)?;
        }
        self.step += 1;
        Ok(outcomes)
    }

    /// Accuracy and loss of a lone model over the whole test split.
    pub fn evaluate(&self) -> Result<EvalStats> {
        match self.evaluate_replicas()?.first() {
            Some(&(_, stats)) => Ok(stats),
            None => Err(Error::Internal("the model is frozen".into())),
        }
    }

    /// Accuracy and loss of every replica the model still computes over the whole test
    /// split, with its index (on rayon's pool, like a step).
    pub fn evaluate_replicas(&self) -> Result<Vec<(usize, EvalStats)>> {
        let stats = evaluate(&self.model, &self.test, &self.device, self.computed.len())?;
        Ok(self.computed.iter().copied().zip(stats).collect())
    }

    /// Attention of every layer for test rows `rows` of a lone model: per layer,
    /// `Some((B, H, Tq, Tk))` for attention layers and `None` for convolutions.
    pub fn attention_of(&self, rows: &[usize]) -> Result<Vec<Option<Tensor>>> {
        match self.replica_attention(rows)?.into_iter().next() {
            Some((_, layers)) => Ok(layers),
            None => Err(Error::Internal("the model is frozen".into())),
        }
    }

    /// [`Self::attention_of`] for every replica the model still computes, with its index.
    pub fn replica_attention(&self, rows: &[usize]) -> Result<Vec<(usize, Vec<Option<Tensor>>)>> {
        let batch = self
            .test
            .batch(&self.for_each_replica(rows), &self.device)?;
        let forward = self.model.forward(&batch.inputs)?;
        let b = rows.len();
        (0..self.computed.len())
            .map(|slot| {
                let layers = forward
                    .attention
                    .iter()
                    .map(|layer| {
                        layer
                            .as_ref()
                            .map(|a| Ok(a.weights.narrow(0, slot * b, b)?.detach()))
                            .transpose()
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((self.computed[slot], layers))
            })
            .collect()
    }
}

/// Accuracy and loss over the whole test split of a model computing `replicas` models side by
/// side (1 for a lone model; every replica sees every row), one entry per replica. Each pass
/// holds about [`EVAL_TOKENS`] tokens. Runs on rayon's pool, as a training step does.
pub fn evaluate(
    model: &Transformer,
    test: &Dataset,
    device: &Device,
    replicas: usize,
) -> Result<Vec<EvalStats>> {
    rayon::scope(|_| evaluate_in_pool(model, test, device, replicas))
}

fn evaluate_in_pool(
    model: &Transformer,
    test: &Dataset,
    device: &Device,
    replicas: usize,
) -> Result<Vec<EvalStats>> {
    if replicas == 0 {
        return Ok(Vec::new());
    }
    let mut loss_sum = vec![0f64; replicas];
    let mut classes = vec![ClassCounts::default(); replicas];
    let mut scored = 0usize;
    let rows: Vec<usize> = (0..test.len()).collect();
    let rows_per_pass = (EVAL_TOKENS / (test.seq_len.max(1) * replicas)).max(1);
    for chunk in rows.chunks(rows_per_pass) {
        let batch = test.batch(&chunk.repeat(replicas), device)?;
        if batch.n_scored == 0 {
            continue;
        }
        let per_replica = batch.n_scored / replicas;
        let logits = model.logits_at(&batch.inputs, &batch.rows)?.detach();
        let losses = (0..replicas)
            .map(|r| {
                cross_entropy(
                    &logits.narrow(0, r * per_replica, per_replica)?,
                    &batch.targets.narrow(0, r * per_replica, per_replica)?,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        // To the host per pass: the losses, and the predictions with their targets, which
        // both accuracies count by class.
        let losses = Tensor::stack(&losses, 0)?.to_vec1::<f32>()?;
        let predicted = logits.argmax(D::Minus1)?.to_vec1::<u32>()?;
        let targets = batch.targets.to_vec1::<u32>()?;
        for (r, counts) in classes.iter_mut().enumerate() {
            let part = r * per_replica..(r + 1) * per_replica;
            counts.add(&predicted[part.clone()], &targets[part]);
            loss_sum[r] += f64::from(losses[r]) * per_replica as f64;
        }
        scored += per_replica;
    }
    let scored = scored.max(1) as f64;
    Ok((0..replicas)
        .map(|r| EvalStats {
            accuracy: classes[r].micro_accuracy(),
            macro_accuracy: classes[r].macro_accuracy(),
            loss: loss_sum[r] / scored,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macro_of(predictions: &[u32], targets: &[u32]) -> f64 {
        let mut counts = ClassCounts::default();
        counts.add(predictions, targets);
        counts.macro_accuracy()
    }

    /// torchmetrics' docstring case: targets [2, 1, 0, 0], predictions [2, 1, 0, 1] give
    /// macro 0.8333 (class 0 half right, 1 and 2 right), where micro gives 0.75.
    #[test]
    fn macro_accuracy_matches_torchmetrics_hand_case() {
        assert!((macro_of(&[2, 1, 0, 1], &[2, 1, 0, 0]) - 5.0 / 6.0).abs() < 1e-12);
        let mut micro = ClassCounts::default();
        micro.add(&[2, 1, 0, 1], &[2, 1, 0, 0]);
        assert_eq!(micro.micro_accuracy(), 0.75);
        // Counted in two parts, as an evaluation's passes do: the same.
        let mut counts = ClassCounts::default();
        counts.add(&[2, 1], &[2, 1]);
        counts.add(&[0, 1], &[0, 0]);
        assert!((counts.macro_accuracy() - 5.0 / 6.0).abs() < 1e-12);
    }

    /// `scripts/check_macro_accuracy.py`'s random case, built from the same generator: 1,000
    /// positions, targets in 0..17, predictions in 0..20, about a tenth ignored (-100, left out
    /// as an evaluation leaves unscored positions out), 60 % of the rest right. The value is
    /// what torchmetrics' `MulticlassAccuracy(num_classes=20, ignore_index=-100)` printed.
    #[test]
    fn macro_accuracy_matches_torchmetrics_on_a_random_case() {
        let mut x: u32 = 12_345;
        let mut next = || {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            x
        };
        let (mut predictions, mut targets) = (Vec::new(), Vec::new());
        for _ in 0..1000 {
            let t = next() % 17;
            let ignored = (next() >> 16) % 10 == 0;
            let r = next();
            let p = if (r >> 8) % 10 < 6 { t } else { (r >> 16) % 20 };
            if !ignored {
                targets.push(t);
                predictions.push(p);
            }
        }
        let mut counts = ClassCounts::default();
        counts.add(&predictions, &targets);
        assert!((counts.macro_accuracy() - 0.505_430_8).abs() < 1e-6);
    }

    /// A class only ever predicted counts as 0; one never seen is left out; nothing is NaN.
    #[test]
    fn macro_accuracy_weighs_the_classes_seen() {
        // Class 3 predicted, never a target: (1 + 0) / 2.
        assert_eq!(macro_of(&[0, 3], &[0, 0]), 0.25);
        // Classes 2 and on never appear: the mean is over classes 0 and 1 only.
        let mut counts = ClassCounts::default();
        counts.add(&[0, 1], &[0, 1]);
        counts.add(&[], &[]);
        assert_eq!(counts.macro_accuracy(), 1.0);
        assert!(ClassCounts::default().macro_accuracy().is_nan());
    }
}
