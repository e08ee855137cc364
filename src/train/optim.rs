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
use crate::ops::fusable;

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

struct Slot {
    var: Var,
    m: Tensor,
    v: Tensor,
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
                let zeros = var.zeros_like()?;
                Ok(Slot {
                    m: zeros.clone(),
                    v: zeros,
                    var,
                })
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

    /// Global L2 norm of the gradients of all variables.
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut total = 0f64;
        for slot in &self.slots {
            if let Some(g) = grads.get(slot.var.as_tensor()) {
                total += f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
            }
        }
        Ok(total.sqrt())
    }

    /// One update with learning rate `lr`; gradients are scaled by `grad_scale` first (clipping).
    pub fn step(&mut self, grads: &GradStore, lr: f64, grad_scale: f64) -> Result<()> {
        self.step += 1;
        let rule = self.rule(lr, grad_scale);
        // Parameters are independent: update them side by side.
        self.slots
            .par_iter_mut()
            .try_for_each(|slot| match grads.get(slot.var.as_tensor()) {
                Some(g) if fusable(g) => slot.update_in_one_pass(g, &rule),
                Some(g) => slot.update(g, &rule),
                None => Ok(()),
            })
    }

    /// The constants of the current step's update.
    fn rule(&self, lr: f64, grad_scale: f64) -> Rule {
        let t = self.step as i32;
        Rule {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            step_size: lr / (1.0 - self.beta1.powi(t)),
            v_correction: 1.0 / (1.0 - self.beta2.powi(t)).sqrt(),
            grad_scale,
        }
    }
}

/// One step's constants of the update rule.
struct Rule {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
    /// lr / (1 − β₁ᵗ)
    step_size: f64,
    /// 1 / √(1 − β₂ᵗ)
    v_correction: f64,
    grad_scale: f64,
}

impl Slot {
    /// PyTorch's AdamW step from tensor ops: any device and dtype.
    fn update(&mut self, g: &Tensor, rule: &Rule) -> Result<()> {
        let g = if rule.grad_scale == 1.0 {
            g.clone()
        } else {
            (g * rule.grad_scale)?
        };
        self.m = ((&self.m * rule.beta1)? + (&g * (1.0 - rule.beta1))?)?;
        self.v = ((&self.v * rule.beta2)? + (g.sqr()? * (1.0 - rule.beta2))?)?;
        let denom = ((self.v.sqrt()? * rule.v_correction)? + rule.eps)?;
        let decayed = (self.var.as_tensor() * (1.0 - rule.lr * rule.weight_decay))?;
        let update = ((&self.m / denom)? * rule.step_size)?;
        self.var.set(&(decayed - update)?)?;
        Ok(())
    }

    /// [`Self::update`] on f32 CPU tensors in one pass over the parameter, where the tensor
    /// ops take twelve passes and allocations per parameter (3% of a benchmark step).
    fn update_in_one_pass(&mut self, g: &Tensor, rule: &Rule) -> Result<()> {
        let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f32>();
        let (mut p, mut m, mut v) = (flat(self.var.as_tensor())?, flat(&self.m)?, flat(&self.v)?);
        let [b1, b2, eps, scale, step_size, v_correction] = [
            rule.beta1,
            rule.beta2,
            rule.eps,
            rule.grad_scale,
            rule.step_size,
            rule.v_correction,
        ]
        .map(|c| c as f32);
        let decay = (1.0 - rule.lr * rule.weight_decay) as f32;
        for (((p, m), v), g) in p.iter_mut().zip(&mut m).zip(&mut v).zip(flat(g)?) {
            let g = g * scale;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            *p = *p * decay - step_size * *m / (v.sqrt() * v_correction + eps);
        }
        let (shape, device) = (self.var.shape().clone(), self.var.device().clone());
        self.m = Tensor::from_vec(m, &shape, &device)?;
        self.v = Tensor::from_vec(v, &shape, &device)?;
        self.var.set(&Tensor::from_vec(p, shape, &device)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

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

    #[test]
    fn the_one_pass_update_matches_the_tensor_ops() {
        let device = Device::Cpu;
        let init = crate::rng::normal_vec(&mut crate::rng::stream(1, "adamw"), 40, 1.0);
        let grad = |step: u64| {
            let g = crate::rng::normal_vec(&mut crate::rng::stream(step, "grad"), 40, 1.0);
            Tensor::from_vec(g, (5, 8), &device).unwrap()
        };
        let slot = || Slot {
            var: Var::from_tensor(&Tensor::from_vec(init.clone(), (5, 8), &device).unwrap())
                .unwrap(),
            m: Tensor::zeros((5, 8), DType::F32, &device).unwrap(),
            v: Tensor::zeros((5, 8), DType::F32, &device).unwrap(),
        };
        let (mut fused, mut composed) = (slot(), slot());
        let config = TrainConfig {
            weight_decay: 0.1,
            ..TrainConfig::default()
        };
        let mut schedule = AdamW::new(vec![], &config).unwrap();
        for step in 1..=3 {
            schedule.step = step;
            let rule = schedule.rule(1e-2, 0.5);
            let g = grad(step as u64);
            fused.update_in_one_pass(&g, &rule).unwrap();
            composed.update(&g, &rule).unwrap();
        }
        for (a, b) in [
            (fused.var.as_tensor(), composed.var.as_tensor()),
            (&fused.m, &composed.m),
            (&fused.v, &composed.v),
        ] {
            let diff = (a - b).unwrap().abs().unwrap().max_all().unwrap();
            assert!(diff.to_scalar::<f32>().unwrap() < 1e-6);
            assert_eq!(a.dims(), &[5, 8]);
        }
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
