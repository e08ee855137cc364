//! Short causal convolutions, the non-attention mixers of hybrid models.
//!
//! `ShortConv` is zoology's `BaseConv`: y = conv_k(u) ⊙ (W u + b) + u, with conv_k a depthwise
//! causal convolution of kernel k (padding k − 1, truncated to the input length) and bias, no
//! activation. `PrevToken` is the fixed "attend to the previous token" layer of the ReBased
//! IoU protocol: y_t = u_{t−1}, y_0 = 0.

use candle_core::{D, Tensor};

use super::Build;
use super::Linear;
use crate::Result;
use crate::ops::causal_conv;
use crate::params::{Init, Params};

pub struct ShortConv {
    /// (k, D): row j multiplies u_{t−(k−1)+j}.
    kernel: Tensor,
    bias: Tensor,
    projection: Linear,
}

impl ShortConv {
    pub fn new(dim: usize, kernel_size: usize, build: &Build, params: &Params) -> Result<Self> {
        // nn.Conv1d(groups = dim): fan_in = kernel_size.
        let bound = 1.0 / (kernel_size as f64).sqrt();
        Ok(Self {
            kernel: params.get("conv.weight", (kernel_size, dim), Init::Uniform(bound))?,
            bias: params.get("conv.bias", dim, Init::Uniform(bound))?,
            projection: build.linear((dim, dim), false, &params.pp("projection"))?,
        })
    }

    /// u (B, T, D) → (B, T, D). With replicas (a (R, k, D) kernel), replica r's parameters act
    /// on its block of rows.
    pub fn forward(&self, u: &Tensor) -> Result<Tensor> {
        let conv = causal_conv(u, &self.kernel, &self.bias)?;
        Ok(((conv * self.projection.forward(u)?)? + u)?)
    }
}

/// y_t = u_{t−1}.
pub struct PrevToken;

impl PrevToken {
    pub fn forward(&self, u: &Tensor) -> Result<Tensor> {
        let (b, t, d) = u.dims3()?;
        let zero = Tensor::zeros((b, 1, d), u.dtype(), u.device())?;
        Ok(Tensor::cat(&[&zero, &u.narrow(D::Minus2, 0, t - 1)?], 1)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn prev_token_shifts_by_one() {
        let u = Tensor::new(&[[[1f32], [2.0], [3.0]]], &Device::Cpu).unwrap();
        let y = PrevToken
            .forward(&u)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(y, vec![0.0, 1.0, 2.0]);
    }

    #[test]
    fn short_conv_is_causal() {
        let p = Params::new(1, &Device::Cpu);
        let build = Build {
            autoencoder: false,
            precision: crate::ops::Precision::F32,
            layout: super::super::Layout::Attnlab,
            n_layers: 1,
        };
        let conv = ShortConv::new(2, 3, &build, &p).unwrap();
        let a = Tensor::new(
            &[[[1f32, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]]],
            &Device::Cpu,
        )
        .unwrap();
        let b = Tensor::new(
            &[[[1f32, 2.0], [3.0, 4.0], [-5.0, 0.0], [9.0, 9.0]]],
            &Device::Cpu,
        )
        .unwrap();
        let ya = conv.forward(&a).unwrap().to_vec3::<f32>().unwrap();
        let yb = conv.forward(&b).unwrap().to_vec3::<f32>().unwrap();
        assert_eq!(
            ya[0][..2],
            yb[0][..2],
            "changing the future leaves the past unchanged"
        );
        assert_ne!(ya[0][2], yb[0][2]);
    }
}
