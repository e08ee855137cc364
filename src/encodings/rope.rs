//! RoPE (Su et al. 2021, arXiv 2104.09864), in the "rotate-half" layout (GPT-NeoX, candle's
//! `rope_slow`): for a head of width d, channel pairs (c, c + d/2) are rotated by the angle
//! t·θ_c with θ_c = base^(−2c/d). The rotation is written with plain tensor ops because
//! candle's fused `rope` kernels have no backward pass.

use candle_core::{D, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::{Encoding, LengthCache};
use crate::{Error, Result};

/// RoPE settings (`[encoding] kind = "rope"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RopeConfig {
    /// Base of the angle frequencies; 10000 in the paper.
    pub base: f64,
}

impl Default for RopeConfig {
    fn default() -> Self {
        Self { base: 10_000.0 }
    }
}

impl RopeConfig {
    pub fn validate(&self, qk_dim: usize) -> Result<()> {
        if !(self.base > 1.0 && self.base.is_finite()) {
            return Err(Error::preset(
                "encoding.base",
                self.base,
                "must be a finite number > 1 (the paper uses 10000)",
            ));
        }
        if !qk_dim.is_multiple_of(2) {
            return Err(Error::preset(
                "encoding.kind",
                "rope",
                format!(
                    "rotates channel pairs, so the per-head query/key width must be even (it is {qk_dim})"
                ),
            ));
        }
        Ok(())
    }
}

pub struct Rope {
    base: f64,
    dim: usize,
    device: Device,
    /// (cos, sin) tables of shape (T, d) per length, stored side by side as (2, T, d).
    tables: LengthCache,
}

impl Rope {
    pub fn new(config: &RopeConfig, dim: usize, device: &Device) -> Self {
        Self {
            base: config.base,
            dim,
            device: device.clone(),
            tables: LengthCache::default(),
        }
    }

    fn cos_sin(&self, t: usize) -> Result<(Tensor, Tensor)> {
        let both = self.tables.get_or(t, || {
            let half = self.dim / 2;
            let mut data = vec![0f32; 2 * t * self.dim];
            for pos in 0..t {
                for c in 0..half {
                    let theta = self.base.powf(-2.0 * c as f64 / self.dim as f64);
                    let angle = pos as f64 * theta;
                    for offset in [c, c + half] {
                        data[pos * self.dim + offset] = angle.cos() as f32;
                        data[(t + pos) * self.dim + offset] = angle.sin() as f32;
                    }
                }
            }
            Ok(Tensor::from_vec(data, (2, t, self.dim), &self.device)?)
        })?;
        Ok((both.get(0)?, both.get(1)?))
    }
}

/// x (…, T, d) rotated: x·cos + rotate_half(x)·sin, rotate_half(x) = [−x₂, x₁].
fn rotate_half_apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

impl Encoding for Rope {
    fn rotate(&self, q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.cos_sin(q.dim(2)?)?;
        Ok((
            rotate_half_apply(q, &cos, &sin)?,
            rotate_half_apply(k, &cos, &sin)?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The score of a rotated pair depends only on the distance between their positions.
    #[test]
    fn scores_depend_on_relative_position_only() {
        let rope = Rope::new(&RopeConfig::default(), 4, &Device::Cpu);
        let v = Tensor::new(&[0.3f32, -1.2, 0.7, 0.5], &Device::Cpu).unwrap();
        let x = v
            .reshape((1, 1, 1, 4))
            .unwrap()
            .repeat((1, 1, 8, 1))
            .unwrap();
        let (q, k) = rope.rotate(&x, &x).unwrap();
        let s = q
            .matmul(&k.t().unwrap())
            .unwrap()
            .squeeze(0)
            .unwrap()
            .squeeze(0)
            .unwrap();
        let s = s.to_vec2::<f32>().unwrap();
        assert!((s[5][2] - s[3][0]).abs() < 1e-5);
        assert!((s[7][7] - s[0][0]).abs() < 1e-5);
        assert!((s[4][1] - s[1][4]).abs() < 1e-5);
    }

    #[test]
    fn rotation_keeps_the_norm() {
        let rope = Rope::new(&RopeConfig::default(), 4, &Device::Cpu);
        let x = Tensor::new(
            &[[[[1f32, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]]]],
            &Device::Cpu,
        )
        .unwrap();
        let (q, _) = rope.rotate(&x, &x).unwrap();
        let norms = q
            .sqr()
            .unwrap()
            .sum(D::Minus1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert!((norms[1] - 30.0).abs() < 1e-4);
    }
}
