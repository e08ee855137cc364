//! AdamW (Loshchilov & Hutter 2019) with PyTorch's update rule, and the learning-rate schedule.
//!
//! attnlab owns its optimiser (candle-nn's keeps its moments private) so that its state can be
//! inspected and saved, and so that gradient clipping and the schedule live in one place.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use super::{Schedule, TrainConfig};
use crate::Result;
use crate::ops::{
    AdamStep, ParamUpdate, adamw_all_in_place, adamw_step_composed, fusable, sum_squares_all,
};

/// Learning rate used at step `step` (0-based) of `total`, with `per_epoch` steps an epoch.
pub fn learning_rate(config: &TrainConfig, step: usize, (total, per_epoch): (usize, usize)) -> f64 {
    let warmup = config.warmup_steps;
    if step < warmup {
        return config.lr * (step + 1) as f64 / warmup as f64;
    }
    let (done, span) = (step - warmup, total.saturating_sub(warmup).max(1));
    let progress = match config.schedule {
        Schedule::Constant => return config.lr,
        Schedule::Cosine => done as f64 / span as f64,
        // Epoch e of E: PyTorch's T_max = E steps of the scheduler, the last epoch at E − 1;
        // epochs counted from step 0, so the rate holds within one even after a warm-up.
        Schedule::CosineEpochs => {
            let per_epoch = per_epoch.max(1);
            (step / per_epoch) as f64 / total.max(1).div_ceil(per_epoch) as f64
        }
    };
    config.min_lr
        + (config.lr - config.min_lr)
            * 0.5
            * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())
}

/// A parameter and its AdamW moments [m; v], side by side in a (2·n) buffer so the fused
/// update reads and writes them in one pass: one buffer per replica (see `params.rs`).
struct Slot {
    var: Var,
    moments: Vec<Tensor>,
}

/// One model's optimiser settings and steps taken (a replica's, in a group).
#[derive(Clone, Copy, Debug)]
struct Hypers {
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: usize,
}

impl From<&TrainConfig> for Hypers {
    fn from(config: &TrainConfig) -> Self {
        Self {
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            weight_decay: config.weight_decay,
            step: 0,
        }
    }
}

/// One replica's learning rate and gradient scale (clipping) for a step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Update {
    pub lr: f64,
    pub grad_scale: f64,
}

/// AdamW over a fixed set of variables: of one model, or of R replicas stacked along each
/// variable's first dimension, each with its own settings, step count and moments, so that a
/// replica is updated exactly as it would be alone.
pub struct AdamW {
    slots: Vec<Slot>,
    replicas: Vec<Hypers>,
    /// Whether the variables carry the replica dimension (false: one lone model).
    stacked: bool,
}

impl AdamW {
    pub fn new(vars: Vec<Var>, config: &TrainConfig) -> Result<Self> {
        Self::build(vars, std::slice::from_ref(config), false)
    }

    /// The optimiser of replicas: `vars` have a leading dimension `configs.len()`, replica r's
    /// slice follows `configs[r]`.
    pub fn replicated(vars: Vec<Var>, configs: &[TrainConfig]) -> Result<Self> {
        Self::build(vars, configs, true)
    }

    fn build(vars: Vec<Var>, configs: &[TrainConfig], stacked: bool) -> Result<Self> {
        let replicas = configs.len();
        let slots = vars
            .into_iter()
            .map(|var| {
                let n = 2 * var.elem_count() / replicas;
                let moments = (0..replicas)
                    .map(|_| Tensor::zeros(n, var.dtype(), var.device()))
                    .collect::<candle_core::Result<_>>()?;
                Ok(Slot { var, moments })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            replicas: configs.iter().map(Hypers::from).collect(),
            stacked,
        })
    }

    /// The optimiser of replicas `keep` only, on `vars`: their slices of the variables, in
    /// the order of [`Self::new`]'s (see `Params::select_replicas`). Their settings, step
    /// counts and moments carry over.
    pub fn select_replicas(&mut self, keep: &[usize], vars: Vec<Var>) -> Result<()> {
        if vars.len() != self.slots.len() || !self.stacked {
            return Err(crate::Error::Internal(
                "replicas are selected from a group's optimiser, for the same variables".into(),
            ));
        }
        for (slot, var) in self.slots.iter_mut().zip(vars) {
            slot.var = var;
            slot.moments = keep.iter().map(|&r| slot.moments[r].clone()).collect();
        }
        self.replicas = keep.iter().map(|&r| self.replicas[r]).collect();
        Ok(())
    }

    /// Replica `r`'s moments: one [m; v] buffer per variable, in the order of the variables
    /// given to [`Self::new`]. With the weights and the step, all a resumed run needs.
    pub fn replica_moments(&self, r: usize) -> Vec<Tensor> {
        self.slots.iter().map(|s| s.moments[r].clone()).collect()
    }

    /// Replaces a lone model's moments ([`Self::replica_moments`]) and update count by saved
    /// ones, so that its next update is the one the saved run would make.
    pub fn restore(&mut self, moments: Vec<Tensor>, step: usize) -> Result<()> {
        if self.stacked || moments.len() != self.slots.len() {
            return Err(crate::Error::Internal(
                "optimizer state is restored for a lone model, one buffer per variable".into(),
            ));
        }
        for (slot, saved) in self.slots.iter_mut().zip(moments) {
            let current = &slot.moments[0];
            // A copy in the moments' own dtype: the fused update writes into this buffer.
            slot.moments[0] = saved.to_dtype(current.dtype())?.copy()?;
        }
        self.replicas[0].step = step;
        Ok(())
    }

    /// Global L2 norm of the gradients of all variables. The squared norms are summed on the
    /// device and read once: one copy to the host per step, not one per parameter.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        Ok(self.grad_norms(grads)?[0])
    }

    /// [`Self::grad_norm`] of each replica, read in one copy.
    pub fn grad_norms(&self, grads: &GradStore) -> Result<Vec<f64>> {
        let replicas = self.replicas.len();
        let parts = self
            .slots
            .iter()
            .filter_map(|slot| grads.get(slot.var.as_tensor()))
            .flat_map(|g| (0..replicas).map(move |r| part(g, r, self.stacked)))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let squares = sum_squares_all(&parts)?;
        // parts[i] is replica i % replicas's.
        let mut per_replica = vec![0.0; replicas];
        for (i, s) in squares.into_iter().enumerate() {
            per_replica[i % replicas] += s;
        }
        Ok(per_replica.into_iter().map(f64::sqrt).collect())
    }

    /// One update with learning rate `lr`; gradients are scaled by `grad_scale` first (clipping).
    pub fn step(&mut self, grads: &GradStore, lr: f64, grad_scale: f64) -> Result<()> {
        self.step_replicas(grads, &[Some(Update { lr, grad_scale })])
    }

    /// One update of each replica with `Some` update; the others (frozen: finished or failed)
    /// keep their parameters and moments.
    pub fn step_replicas(&mut self, grads: &GradStore, updates: &[Option<Update>]) -> Result<()> {
        self.step_with(grads, updates, true)
    }

    /// [`Self::step_replicas`], by the fused in-place kernels where they run (`fused`) or by
    /// tensor ops.
    fn step_with(
        &mut self,
        grads: &GradStore,
        updates: &[Option<Update>],
        fused: bool,
    ) -> Result<()> {
        if updates.len() != self.replicas.len() {
            return Err(crate::Error::Internal(format!(
                "{} updates for {} replicas",
                updates.len(),
                self.replicas.len()
            )));
        }
        let rules: Vec<Option<AdamStep>> = updates
            .iter()
            .zip(&mut self.replicas)
            .map(|(update, hypers)| {
                update.map(|u| {
                    hypers.step += 1;
                    hypers.rule(u)
                })
            })
            .collect();
        let stacked = self.stacked;
        let (mut in_place, mut composed) = (Vec::new(), Vec::new());
        for slot in &mut self.slots {
            match grads.get(slot.var.as_tensor()) {
                Some(g) if fused && fusable(g) => {
                    in_place.extend(slot.updates(g, &rules, stacked)?)
                }
                Some(g) => composed.push((slot, g)),
                None => {}
            }
        }
        // One call for every fused update: a single kernel launch on a GPU.
        adamw_all_in_place(&in_place)?;
        composed
            .into_iter()
            .try_for_each(|(slot, g)| slot.update_composed(g, &rules, stacked))
    }
}

impl Hypers {
    /// The constants of the current step's update.
    fn rule(&self, update: Update) -> AdamStep {
        let t = self.step as i32;
        AdamStep {
            beta1: self.beta1 as f32,
            beta2: self.beta2 as f32,
            grad_scale: update.grad_scale as f32,
            decay: (1.0 - update.lr * self.weight_decay) as f32,
            step_size: (update.lr / (1.0 - self.beta1.powi(t))) as f32,
            v_correction: (1.0 / (1.0 - self.beta2.powi(t)).sqrt()) as f32,
            eps: self.eps as f32,
        }
    }
}

/// Replica r's slice of a variable or gradient when they are `stacked`, else all of it. A
/// slice is a view of the same storage, so an in-place update of it lands in the variable.
fn part(x: &Tensor, r: usize, stacked: bool) -> candle_core::Result<Tensor> {
    if stacked {
        x.narrow(0, r, 1)
    } else {
        Ok(x.clone())
    }
}

impl Slot {
    /// The in-place updates of each updated replica's slice of the variable.
    fn updates(
        &self,
        g: &Tensor,
        rules: &[Option<AdamStep>],
        stacked: bool,
    ) -> Result<Vec<ParamUpdate<'_>>> {
        let mut updates = Vec::with_capacity(rules.len());
        for (r, rule) in rules.iter().enumerate() {
            if let Some(step) = rule {
                updates.push(ParamUpdate {
                    param: part(self.var.as_tensor(), r, stacked)?,
                    moments: &self.moments[r],
                    grad: part(g, r, stacked)?,
                    step: *step,
                });
            }
        }
        Ok(updates)
    }

    /// PyTorch's AdamW step from tensor ops: any device and dtype.
    fn update_composed(
        &mut self,
        g: &Tensor,
        rules: &[Option<AdamStep>],
        stacked: bool,
    ) -> Result<()> {
        let mut parts = Vec::with_capacity(rules.len());
        for (r, rule) in rules.iter().enumerate() {
            let param = part(self.var.as_tensor(), r, stacked)?;
            parts.push(match rule {
                Some(rule) => {
                    let g = part(g, r, stacked)?;
                    let (param, moments) = adamw_step_composed(&param, &self.moments[r], &g, rule)?;
                    self.moments[r] = moments;
                    param
                }
                // A copy: a variable cannot be set from a view of itself.
                None => param.copy()?,
            });
        }
        self.var
            .set(&Tensor::cat(&parts, 0)?.reshape(self.var.shape())?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn cosine_schedule_matches_pytorch() {
        let c = TrainConfig {
            lr: 1.0,
            ..TrainConfig::default()
        };
        assert_eq!(learning_rate(&c, 0, (100, 10)), 1.0);
        assert!((learning_rate(&c, 50, (100, 10)) - 0.5).abs() < 1e-12);
        assert!(learning_rate(&c, 100, (100, 10)).abs() < 1e-12);
    }

    /// MAD's schedule: `CosineAnnealingLR(T_max = 10, eta_min = 1e-6)` stepped per epoch over
    /// 10 epochs of 7 steps, at epochs 0, 1, 5 and 9: the closed form PyTorch's documentation
    /// gives, η_min + (η₀ − η_min)(1 + cos(π e / 10)) / 2, evaluated in Python.
    #[test]
    fn the_per_epoch_cosine_holds_within_an_epoch_and_steps_between() {
        let c = TrainConfig {
            lr: 1e-3,
            min_lr: 1e-6,
            schedule: Schedule::CosineEpochs,
            ..TrainConfig::default()
        };
        let at = |step| learning_rate(&c, step, (70, 7));
        let pytorch = [
            (0, 1e-3),
            (1, 9.755_527_298_894_294e-4),
            (5, 5.005e-4),
            (9, 2.544_727_011_057_081_4e-5),
        ];
        for (epoch, expected) in pytorch {
            for step in epoch * 7..(epoch + 1) * 7 {
                let lr = at(step);
                assert!(
                    (lr - expected).abs() < 1e-12,
                    "step {step}: {lr} against {expected}"
                );
            }
        }
        // After a warm-up of 3 steps, epoch 1 (steps 7 to 13) still holds one rate.
        let warm = TrainConfig {
            warmup_steps: 3,
            ..c
        };
        let rates: Vec<f64> = (7..14).map(|s| learning_rate(&warm, s, (70, 7))).collect();
        assert!(rates.iter().all(|&r| r == rates[0]), "{rates:?}");
        assert_eq!(learning_rate(&warm, 0, (70, 7)), 1e-3 / 3.0);
    }

    #[test]
    fn warmup_ramps_linearly() {
        let c = TrainConfig {
            lr: 1.0,
            warmup_steps: 4,
            ..TrainConfig::default()
        };
        assert_eq!(learning_rate(&c, 0, (100, 10)), 0.25);
        assert_eq!(learning_rate(&c, 3, (100, 10)), 1.0);
    }

    /// The fused in-place update and the tensor ops agree over three steps, with clipping
    /// scale and weight decay, on two parameters.
    #[test]
    fn the_fused_update_matches_the_tensor_ops() {
        let device = Device::Cpu;
        let init = |seed: u64, n: usize| {
            let data = crate::rng::normal_vec(&mut crate::rng::stream(seed, "adamw"), n, 1.0);
            Var::from_tensor(&Tensor::from_vec(data, n, &device).unwrap()).unwrap()
        };
        let config = TrainConfig {
            weight_decay: 0.1,
            ..TrainConfig::default()
        };
        let (fused_vars, composed_vars) = ([init(1, 40), init(2, 7)], [init(1, 40), init(2, 7)]);
        let mut fused = AdamW::new(fused_vars.to_vec(), &config).unwrap();
        let mut composed = AdamW::new(composed_vars.to_vec(), &config).unwrap();
        for step in 1..=3u64 {
            let loss = |vars: &[Var; 2]| {
                // A loss whose gradients differ between entries and steps.
                let w = Tensor::from_vec(
                    crate::rng::normal_vec(&mut crate::rng::stream(step, "grad"), 40, 1.0),
                    40,
                    &device,
                )
                .unwrap();
                let a = (vars[0].as_tensor() * &w).unwrap().sum_all().unwrap();
                let b = vars[1].as_tensor().sqr().unwrap().sum_all().unwrap();
                (a + b).unwrap().backward().unwrap()
            };
            let update = [Some(Update {
                lr: 1e-2,
                grad_scale: 0.5,
            })];
            fused.step_with(&loss(&fused_vars), &update, true).unwrap();
            composed
                .step_with(&loss(&composed_vars), &update, false)
                .unwrap();
        }
        for (a, b) in fused.slots.iter().zip(&composed.slots) {
            assert_close(a.var.as_tensor(), b.var.as_tensor());
            assert_close(&a.moments[0], &b.moments[0]);
        }
    }

    fn assert_close(x: &Tensor, y: &Tensor) {
        let diff = (x - y).unwrap().abs().unwrap().max_all().unwrap();
        assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
    }

    /// Two replicas with their own learning rate, weight decay and β₂, the second frozen
    /// after its second step, end where each would alone: by the fused kernels and the
    /// tensor ops, and their gradient norms are their own.
    #[test]
    fn replicas_update_as_their_lone_models() {
        let device = Device::Cpu;
        let start = |r: u64| crate::rng::normal_vec(&mut crate::rng::stream(r, "adamw"), 12, 1.0);
        let configs = [
            TrainConfig::default(),
            TrainConfig {
                weight_decay: 0.3,
                beta2: 0.99,
                ..TrainConfig::default()
            },
        ];
        let direction = |step: usize, r: usize| {
            let data =
                crate::rng::normal_vec(&mut crate::rng::stream(step as u64, "grad"), 24, 1.0);
            Tensor::from_vec(data[12 * r..12 * (r + 1)].to_vec(), 12, &device).unwrap()
        };
        let update = |step: usize, r: usize| {
            (r == 0 || step < 2).then_some(Update {
                lr: [1e-2, 3e-2][r],
                grad_scale: 1.0,
            })
        };
        for fused in [true, false] {
            let lone: Vec<Var> = (0..2)
                .map(|r| Var::from_vec(start(r as u64), 12, &device).unwrap())
                .collect();
            let stacked = Var::from_vec([start(0), start(1)].concat(), (2, 12), &device).unwrap();
            let mut lone_opts: Vec<AdamW> = (0..2)
                .map(|r| AdamW::new(vec![lone[r].clone()], &configs[r]).unwrap())
                .collect();
            let mut group = AdamW::replicated(vec![stacked.clone()], &configs).unwrap();
            for step in 0..4 {
                let mut norms = Vec::new();
                for r in 0..2 {
                    let loss = (lone[r].as_tensor() * direction(step, r)).unwrap();
                    let grads = loss.sum_all().unwrap().backward().unwrap();
                    norms.push(lone_opts[r].grad_norm(&grads).unwrap());
                    let updates = [update(step, r)];
                    lone_opts[r].step_with(&grads, &updates, fused).unwrap();
                }
                let both = Tensor::stack(&[direction(step, 0), direction(step, 1)], 0).unwrap();
                let loss = (stacked.as_tensor() * both).unwrap();
                let grads = loss.sum_all().unwrap().backward().unwrap();
                let group_norms = group.grad_norms(&grads).unwrap();
                assert!((group_norms[0] - norms[0]).abs() < 1e-5);
                assert!((group_norms[1] - norms[1]).abs() < 1e-5);
                let updates = [update(step, 0), update(step, 1)];
                group.step_with(&grads, &updates, fused).unwrap();
            }
            for (r, lone) in lone.iter().enumerate() {
                assert_close(&stacked.as_tensor().get(r).unwrap(), lone.as_tensor());
            }
        }
    }

    #[test]
    fn grad_norm_is_the_norm_of_all_gradients() {
        let (a, b) = (
            Var::new(&[3f32], &Device::Cpu).unwrap(),
            Var::new(&[4f32], &Device::Cpu).unwrap(),
        );
        let opt = AdamW::new(vec![a.clone(), b.clone()], &TrainConfig::default()).unwrap();
        // d/da a²/2 = 3, d/db b²/2 = 4: the norm is 5.
        let loss =
            ((a.as_tensor().sqr().unwrap() + b.as_tensor().sqr().unwrap()).unwrap() * 0.5).unwrap();
        let grads = loss.sum_all().unwrap().backward().unwrap();
        assert!((opt.grad_norm(&grads).unwrap() - 5.0).abs() < 1e-6);
    }

    /// First AdamW step on p = 1 with gradient 2, lr 0.1, wd 0.1, by torch.optim.AdamW's rule:
    /// p·(1 − lr·wd) − lr·m̂/(√v̂ + ε) = 0.99 − 0.1·2/2 = 0.89.
    #[test]
    fn first_step_matches_pytorch() {
        let var = Var::new(&[1f32], &Device::Cpu).unwrap();
        let c = TrainConfig {
            weight_decay: 0.1,
            ..TrainConfig::default()
        };
        let mut opt = AdamW::new(vec![var.clone()], &c).unwrap();
        let loss = (var.as_tensor() * 2.0).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        opt.step(&grads, 0.1, 1.0).unwrap();
        let p = var.as_tensor().to_vec1::<f32>().unwrap()[0];
        assert!((p - 0.89).abs() < 1e-6, "{p}");
    }
}
