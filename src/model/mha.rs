//! Multi-head attention: project q, k, v with one fused matrix, split heads, let the
//! mechanism produce its weights, mix the values, merge heads, project out.

use std::sync::Arc;

use candle_core::Tensor;
use serde::Serialize;

use super::stages::{HeadNorm, InputConv};
use super::{Build, Linear};
use crate::Result;
use crate::attention::{Attention, Mechanism, OutputStage};
use crate::encodings::Encoding;
use crate::ops::{self, Precision, WeightDropout, matmul_merge_heads};
use crate::params::Params;

/// What replaces an ablated head's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Ablation {
    /// Zeros: the head removed.
    Zero,
    /// Its mean over the input's positions: what it says about this input kept, where it
    /// says it lost.
    Mean,
}

impl Ablation {
    /// As the CLI and JSON spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Zero => "zero",
            Self::Mean => "mean",
        }
    }
}

/// One head to ablate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadAblation {
    pub layer: usize,
    pub head: usize,
    pub mode: Ablation,
}

pub struct MultiHeadAttention {
    qkv: Linear,
    /// The mechanism's [`InputConv`], where it has one.
    input_conv: Option<InputConv>,
    out: Linear,
    n_heads: usize,
    qk_dim: usize,
    head_dim: usize,
    mechanism: Arc<dyn Mechanism>,
    encoding: Arc<dyn Encoding>,
    /// The mechanism's [`OutputStage`], where it has one.
    head_norm: Option<HeadNorm>,
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
        let width = n_heads * (2 * qk_dim + head_dim) + mechanism.token_inputs();
        let head_norm = match mechanism.output_stage() {
            OutputStage::Plain => None,
            stage => Some(HeadNorm::new(
                d_model,
                n_heads * head_dim,
                head_dim,
                stage,
                build,
                params,
            )?),
        };
        let input_conv = mechanism
            .input_conv()
            .map(|size| {
                let widths = [n_heads * qk_dim, n_heads * qk_dim, n_heads * head_dim];
                InputConv::new(size, widths, params)
            })
            .transpose()?;
        Ok(Self {
            head_norm,
            input_conv,
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
        let split = |which: usize, start: usize, width: usize| -> Result<Tensor> {
            let rows = self.qkv.rows(start * h, width * h)?;
            let Some(conv) = &self.input_conv else {
                return rows.forward_heads(x, h);
            };
            conv.apply(which, &rows.forward(x)?, h)
        };
        Ok((
            split(0, 0, self.qk_dim)?,
            split(1, self.qk_dim, self.qk_dim)?,
            split(2, 2 * self.qk_dim, self.head_dim)?,
        ))
    }

    /// The mechanism for input x: itself, or bound to the per-token inputs it reads from x
    /// ([`Mechanism::token_inputs`]), the fused projection's last columns.
    fn mechanism_for(&self, x: &Tensor) -> Result<Arc<dyn Mechanism>> {
        let inputs = self.mechanism.token_inputs();
        if inputs == 0 {
            return Ok(self.mechanism.clone());
        }
        let start = self.n_heads * (2 * self.qk_dim + self.head_dim);
        let projected = self.qkv.rows(start, inputs)?.forward(x)?;
        self.mechanism.with_token_inputs(&projected)
    }

    /// The heads' outputs side by side (B, T, H·Dh) through the mechanism's output stage,
    /// which may read the layer's input x.
    fn finish(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        match &self.head_norm {
            Some(stage) => stage.apply(x, &y),
            None => Ok(y),
        }
    }

    /// The heads' outputs side by side (B, T, H·Dh), before the output projection, and the
    /// layer's attention.
    fn attend(&self, x: &Tensor) -> Result<(Tensor, Attention)> {
        let (q, k, v) = self.project(x)?;
        let mechanism = self.mechanism_for(x)?;
        let attention = mechanism.attend(&q, &k, &v, self.encoding.as_ref())?;
        let y =
            self.precision
                .product(&attention.weights, &attention.values, matmul_merge_heads)?;
        Ok((self.finish(x, y)?, attention))
    }

    /// The heads' outputs side by side (B, T, H·Dh) for training, through the output stage:
    /// the mechanism's fused kernel where it has one ([`Mechanism::fused_output`]), else
    /// weights · values, the weights under dropout (one seed per replica) when
    /// `dropout_seeds` are given and the layer has some.
    fn mixed(&self, x: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        let y = self.mixed_heads(x, dropout_seeds)?;
        self.finish(x, y)
    }

    /// [`Self::mixed`] before the output stage.
    fn mixed_heads(&self, x: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        let (q, k, v) = self.project(x)?;
        let encoding = self.encoding.as_ref();
        let dropout = dropout_seeds
            .filter(|_| self.attention_dropout > 0.0)
            .map(|seeds| WeightDropout {
                p: self.attention_dropout,
                seeds,
            });
        let mechanism = self.mechanism_for(x)?;
        if let Some(y) = mechanism.fused_output(&q, &k, &v, encoding, dropout)? {
            return Ok(y);
        }
        let attention = mechanism.attend(&q, &k, &v, encoding)?;
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

    /// Heads per layer.
    pub fn n_heads(&self) -> usize {
        self.n_heads
    }

    /// x (B, T, D) → output (B, T, D) with head `ablation.head`'s output (after the output
    /// stage, before the output projection: TransformerLens's `hook_z`) replaced by zeros or
    /// by its mean over the input's positions (all of them: a position's replacement carries
    /// what the head wrote at later positions too, as a mean over a reference set would).
    pub fn forward_ablated(&self, x: &Tensor, ablation: HeadAblation) -> Result<Tensor> {
        let (y, _) = self.attend(x)?;
        let dh = self.head_dim;
        let start = ablation.head * dh;
        let own = y.narrow(2, start, dh)?;
        let replaced = match ablation.mode {
            Ablation::Zero => own.zeros_like()?,
            Ablation::Mean => {
                let (b, t, _) = own.dims3()?;
                let mean = own.reshape((b * t, dh))?.mean_keepdim(0)?;
                mean.reshape((1, 1, dh))?
                    .broadcast_as(own.shape())?
                    .contiguous()?
            }
        };
        let width = y.dim(2)?;
        let before = y.narrow(2, 0, start)?;
        let after = y.narrow(2, start + dh, width - start - dh)?;
        self.out
            .forward(&Tensor::cat(&[&before, &replaced, &after], 2)?)
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
        let x = x.detach();
        let (q, k, v) = self.project(&x)?;
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let y = self
            .mechanism_for(&x)?
            .output_blocks(&q, &k, &v, self.encoding.as_ref(), chunk)?;
        let (b, h, t, dh) = y.dims4()?;
        let y = y.transpose(1, 2)?.reshape((b, t, h * dh))?; // (B, T, H·Dh)
        let y = self.finish(&x, y)?;
        Ok(self.out.forward(&y)?.detach())
    }
}
