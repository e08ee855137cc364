//! AdamW (Loshchilov & Hutter 2019) with PyTorch's update rule, and the learning-rate schedule.
//!
//! attnlab owns its optimiser (candle-nn's keeps its moments private) so that its state can be
//! inspected and saved, and so that gradient clipping and the schedule live in one place.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};

use super::TrainConfig;
use crate::Result;

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
        let t = self.step as i32;
        let step_size = lr / (1.0 - self.beta1.powi(t));
        let v_correction = 1.0 / (1.0 - self.beta2.powi(t)).sqrt();
        for slot in &mut self.slots {
            let Some(g) = grads.get(slot.var.as_tensor()) else {
                continue;
            };
            let g = if grad_scale == 1.0 {
                g.clone()
            } else {
                (g * grad_scale)?
            };
            slot.m = ((&slot.m * self.beta1)? + (&g * (1.0 - self.beta1))?)?;
            slot.v = ((&slot.v * self.beta2)? + (g.sqr()? * (1.0 - self.beta2))?)?;
            let denom = ((slot.v.sqrt()? * v_correction)? + self.eps)?;
            let decayed = (slot.var.as_tensor() * (1.0 - lr * self.weight_decay))?;
            let update = ((&slot.m / denom)? * step_size)?;
            slot.var.set(&(decayed - update)?)?;
        }
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
