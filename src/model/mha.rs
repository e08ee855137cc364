//! Multi-head attention: project q, k, v with one fused matrix, split heads, let the
//! mechanism produce its weights, mix the values, merge heads, project out.

use std::sync::Arc;

use candle_core::Tensor;

use super::{Build, Linear};
use crate::Result;
use crate::attention::{Attention, Mechanism};
use crate::encodings::Encoding;
use crate::ops::{self, Precision, WeightDropout, matmul_merge_heads};
use crate::params::Params;

pub struct MultiHeadAttention {
    qkv: Linear,
    out: Linear,
    n_heads: usize,
    qk_dim: usize,
    head_dim: usize,
    mechanism: Arc<dyn Mechanism>,
    encoding: Arc<dyn Encoding>,
    precision: Precision,
    /// Dropout on the attention weights while training.
    attention_dropout: f64,
}

impl MultiHeadAttention {
    pub fn new(
        d_model: usize,
        n_heads: usize,
        qk_dim: usize,
        mechanism: Arc<dyn Mechanism>,
        encoding: Arc<dyn Encoding>,
        build: &Build,
        params: &Params,
    ) -> Result<Self> {
        let head_dim = d_model / n_heads;
        let width = n_heads * (2 * qk_dim + head_dim);
        Ok(Self {
            qkv: build.linear((d_model, width), false, &params.pp("qkv"))?,
            out: build.linear((n_heads * head_dim, d_model), true, &params.pp("out"))?,
            n_heads,
            qk_dim,
            head_dim,
            mechanism,
            encoding,
            precision: build.precision,
            attention_dropout: 0.0,
        })
    }

    /// The layer with dropout `p` on its attention weights while training.
    pub fn with_attention_dropout(self, p: f64) -> Self {
        Self {
            attention_dropout: p,
            ..self
        }
    }

    /// The positional encoding this layer uses (shared with other layers unless per layer).
    pub fn encoding(&self) -> &Arc<dyn Encoding> {
        &self.encoding
    }

    /// q, k (B, H, T, Dqk) and v (B, H, T, Dh) of x (B, T, D).
    fn project(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let h = self.n_heads;
        // Column blocks of the fused (B, T, H·(2·Dqk + Dh)) projection, one at a time.
        let split = |start: usize, width: usize| -> Result<Tensor> {
            self.qkv.rows(start * h, width * h)?.forward_heads(x, h)
        };
        Ok((
            split(0, self.qk_dim)?,
            split(self.qk_dim, self.qk_dim)?,
            split(2 * self.qk_dim, self.head_dim)?,
        ))
    }

    /// Heads' outputs (B, H, T, Dh) → (B, T, D).
    fn merge(&self, y: &Tensor) -> Result<Tensor> {
        let (b, h, t, dh) = y.dims4()?;
        let y = y.transpose(1, 2)?.reshape((b, t, h * dh))?; // (B, T, H·Dh)
        self.out.forward(&y)
    }

    /// The heads' outputs side by side (B, T, H·Dh), before the output projection, and the
    /// layer's attention.
    fn attend(&self, x: &Tensor) -> Result<(Tensor, Attention)> {
        let (q, k, v) = self.project(x)?;
        let attention = self.mechanism.attend(&q, &k, &v, self.encoding.as_ref())?;
        let y =
            self.precision
                .product(&attention.weights, &attention.values, matmul_merge_heads)?;
        Ok((y, attention))
    }

    /// The heads' outputs side by side (B, T, H·Dh) for training: the mechanism's fused
    /// kernel where it has one ([`Mechanism::fused_output`]), else weights · values, the
    /// weights under dropout (one seed per replica) when `dropout_seeds` are given and the
    /// layer has some.
    fn mixed(&self, x: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        let (q, k, v) = self.project(x)?;
        let encoding = self.encoding.as_ref();
        let dropout = dropout_seeds
            .filter(|_| self.attention_dropout > 0.0)
            .map(|seeds| WeightDropout {
                p: self.attention_dropout,
                seeds,
            });
        if let Some(y) = self.mechanism.fused_output(&q, &k, &v, encoding, dropout)? {
            return Ok(y);
        }
        let attention = self.mechanism.attend(&q, &k, &v, encoding)?;
        let weights = match dropout {
            Some(d) => ops::dropout(&attention.weights, d.p, d.seeds)?,
            None => attention.weights,
        };
        self.precision
            .product(&weights, &attention.values, matmul_merge_heads)
    }

    /// x (B, T, D) → output (B, T, D) and the layer's attention.
    pub fn forward(&self, x: &Tensor) -> Result<(Tensor, Attention)> {
        let (y, attention) = self.attend(x)?;
        Ok((self.out.forward(&y)?, attention))
    }

    /// x (B, T, D) → output (B, T, D) for training, without the attention weights where the
    /// mechanism can do without them; `dropout_seeds` while training (see [`Self::mixed`]).
    pub fn forward_output(&self, x: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        self.out.forward(&self.mixed(x, dropout_seeds)?)
    }

    /// x (B, T, D) → the output at the flat positions `rows` (b·T + t) only: (R, D), for
    /// training and evaluation. Every query still attends; only the output projection is
    /// limited to the rows.
    pub fn forward_rows(
        &self,
        x: &Tensor,
        rows: &Tensor,
        dropout_seeds: Option<&[u64]>,
    ) -> Result<Tensor> {
        let y = self.mixed(x, dropout_seeds)?;
        self.out.forward(&super::gather_rows(&y, rows)?)
    }

    /// x (B, T, D) → output (B, T, D), the queries taken `chunk` at a time, so at most
    /// chunk × T attention weights per head exist at once. For evaluation: the result is
    /// detached from the autograd graph, which lets each block's tensors be freed.
    pub fn forward_blocks(&self, x: &Tensor, chunk: usize) -> Result<Tensor> {
        let (q, k, v) = self.project(&x.detach())?;
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let y = self
            .mechanism
            .output_blocks(&q, &k, &v, self.encoding.as_ref(), chunk)?;
        Ok(self.merge(&y)?.detach())
    }
}
