//! AdamW (Loshchilov & Hutter 2019) with PyTorch's update rule, and the learning-rate schedule.
//!
//! attnlab owns its optimiser (candle-nn's keeps its moments private) so that its state can be
//! inspected and saved, and so that gradient clipping and the schedule live in one place.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::TrainConfig;
use crate::Result;
use crate::ops::{AdamStep, adamw_in_place, adamw_step_composed, fusable, sum_squares};

/// How the learning rate evolves after warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Cosine decay from `lr` to `min_lr` over the run (PyTorch's `CosineAnnealingLR` per step).
    #[default]
    Cosine,
    /// `lr` throughout.
    Constant,
}

/// Learning rate used at step `step` (0-based) of `total`.
pub fn learning_rate(config: &TrainConfig, step: usize, total: usize) -> f64 {
    let warmup = config.warmup_steps;
    if step < warmup {
        return config.lr * (step + 1) as f64 / warmup as f64;
    }
    match config.schedule {
        Schedule::Constant => config.lr,
        Schedule::Cosine => {
            let span = total.saturating_sub(warmup).max(1) as f64;
            let progress = ((step - warmup) as f64 / span).min(1.0);
            config.min_lr
                + (config.lr - config.min_lr)
                    * 0.5
                    * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

/// A parameter and its AdamW moments [m; v], side by side in one (2·n) buffer so the fused
/// update reads and writes them in one pass.
struct Slot {
    var: Var,
    moments: Tensor,
}

/// AdamW over a fixed set of variables.
pub struct AdamW {
    slots: Vec<Slot>,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    step: usize,
}

impl AdamW {
    pub fn new(vars: Vec<Var>, config: &TrainConfig) -> Result<Self> {
        let slots = vars
            .into_iter()
            .map(|var| {
                let moments = Tensor::zeros(2 * var.elem_count(), var.dtype(), var.device())?;
                Ok(Slot { var, moments })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            slots,
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            weight_decay: config.weight_decay,
            step: 0,
        })
    }

    /// Global L2 norm of the gradients of all variables. The squared norms are summed on the
    /// device and read once: one copy to the host per step, not one per parameter.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let squares = self
            .slots
            .iter()
            .filter_map(|slot| grads.get(slot.var.as_tensor()))
            .map(sum_squares)
            .collect::<Result<Vec<_>>>()?;
        if squares.is_empty() {
            return Ok(0.0);
        }
        let total = Tensor::stack(&squares, 0)?.sum_all()?.to_scalar::<f32>()?;
        Ok(f64::from(total).sqrt())
    }

    /// One update with learning rate `lr`; gradients are scaled by `grad_scale` first (clipping).
    pub fn step(&mut self, grads: &GradStore, lr: f64, grad_scale: f64) -> Result<()> {
        self.step_with(grads, lr, grad_scale, true)
    }

    /// [`Self::step`], by the fused in-place kernels where they run (`fused`) or by tensor ops.
    fn step_with(
        &mut self,
        grads: &GradStore,
        lr: f64,
        grad_scale: f64,
        fused: bool,
    ) -> Result<()> {
        self.step += 1;
        let rule = self.rule(lr, grad_scale);
        let update = |slot: &mut Slot| match grads.get(slot.var.as_tensor()) {
            Some(g) if fused && fusable(g) => {
                adamw_in_place(slot.var.as_tensor(), &slot.moments, g, &rule)
            }
            Some(g) => slot.update_composed(g, &rule),
            None => Ok(()),
        };
        // Parameters are independent: on the CPU, update them side by side. A GPU gets its
        // launches from one thread, in order.
        if self.slots.iter().all(|slot| slot.var.device().is_cpu()) {
            self.slots.par_iter_mut().try_for_each(update)
        } else {
            self.slots.iter_mut().try_for_each(update)
        }
    }

    /// The constants of the current step's update.
    fn rule(&self, lr: f64, grad_scale: f64) -> AdamStep {
        let t = self.step as i32;
        AdamStep {
            beta1: self.beta1 as f32,
            beta2: self.beta2 as f32,
            grad_scale: grad_scale as f32,
            decay: (1.0 - lr * self.weight_decay) as f32,
            step_size: (lr / (1.0 - self.beta1.powi(t))) as f32,
            v_correction: (1.0 / (1.0 - self.beta2.powi(t)).sqrt()) as f32,
            eps: self.eps as f32,
        }
    }
}

impl Slot {
    /// PyTorch's AdamW step from tensor ops: any device and dtype.
    fn update_composed(&mut self, g: &Tensor, rule: &AdamStep) -> Result<()> {
        let (param, moments) = adamw_step_composed(self.var.as_tensor(), &self.moments, g, rule)?;
        self.var.set(&param)?;
        self.moments = moments;
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
        assert_eq!(learning_rate(&c, 0, 100), 1.0);
        assert!((learning_rate(&c, 50, 100) - 0.5).abs() < 1e-12);
        assert!(learning_rate(&c, 100, 100).abs() < 1e-12);
    }

    #[test]
    fn warmup_ramps_linearly() {
        let c = TrainConfig {
            lr: 1.0,
            warmup_steps: 4,
            ..TrainConfig::default()
        };
        assert_eq!(learning_rate(&c, 0, 100), 0.25);
        assert_eq!(learning_rate(&c, 3, 100), 1.0);
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
            fused
                .step_with(&loss(&fused_vars), 1e-2, 0.5, true)
                .unwrap();
            composed
                .step_with(&loss(&composed_vars), 1e-2, 0.5, false)
                .unwrap();
        }
        for (a, b) in fused.slots.iter().zip(&composed.slots) {
            for (x, y) in [
                (a.var.as_tensor(), b.var.as_tensor()),
                (&a.moments, &b.moments),
            ] {
                let diff = (x - y).unwrap().abs().unwrap().max_all().unwrap();
                assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
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
