//! Multi-head attention: project q, k, v with one fused matrix, split heads, let the
//! mechanism produce its weights, mix the values, merge heads, project out.

use std::sync::Arc;

use candle_core::Tensor;

use super::Linear;
use crate::Result;
use crate::attention::{Attention, Mechanism};
use crate::encodings::Encoding;
use crate::params::Params;

pub struct MultiHeadAttention {
    qkv: Linear,
    out: Linear,
    n_heads: usize,
    qk_dim: usize,
    head_dim: usize,
    mechanism: Arc<dyn Mechanism>,
    encoding: Arc<dyn Encoding>,
}

impl MultiHeadAttention {
    pub fn new(
        d_model: usize,
        n_heads: usize,
        qk_dim: usize,
        mechanism: Arc<dyn Mechanism>,
        encoding: Arc<dyn Encoding>,
        params: &Params,
    ) -> Result<Self> {
        let head_dim = d_model / n_heads;
        let width = n_heads * (2 * qk_dim + head_dim);
        Ok(Self {
            qkv: Linear::new(d_model, width, true, &params.pp("qkv"))?,
            out: Linear::new(n_heads * head_dim, d_model, true, &params.pp("out"))?,
            n_heads,
            qk_dim,
            head_dim,
            mechanism,
            encoding,
        })
    }

    /// The positional encoding this layer uses (shared with other layers unless per layer).
    pub fn encoding(&self) -> &Arc<dyn Encoding> {
        &self.encoding
    }

    /// x (B, T, D) → output (B, T, D) and the layer's attention.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Attention)> {
        let (b, t, _) = x.dims3()?;
        let h = self.n_heads;
        let qkv = self.qkv.forward(x)?; // (B, T, H·(2·Dqk + Dh))
        let split = |start: usize, width: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, start * h, width * h)?
                .reshape((b, t, h, width))?
                .transpose(1, 2)?
                .contiguous()?) // (B, H, T, width)
        };
        let q = split(0, self.qk_dim)?;
        let k = split(self.qk_dim, self.qk_dim)?;
        let v = split(2 * self.qk_dim, self.head_dim)?;
        let attention = self.mechanism.attend(&q, &k, &v, self.encoding.as_ref())?;
        let y = attention.weights.matmul(&attention.values)?; // (B, H, T, Dh)
        let y = y.transpose(1, 2)?.reshape((b, t, h * self.head_dim))?; // (B, T, H·Dh)
        Ok((self.out.forward(&y)?, attention))
    }
}
