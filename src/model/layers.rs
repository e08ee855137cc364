//! Linear, the norms, Embedding and the MLPs, written with differentiable ops only. They start
//! like PyTorch's modules (so `attnlab bench` and the PyTorch reference start alike), like
//! zoology's or like MAD's ([`super::Build`] chooses, from `model.layout`).

use candle_core::Tensor;

use super::{Activation, Build, Layout};
use crate::Result;
use crate::ops::{
    Precision, add_bias_replicas, add_broadcast, gelu_erf, gelu_tanh, layer_norm, linear,
    linear_heads, linear_replicas, rms_norm, silu_gate,
};
use crate::params::{Init, Params};

/// How a linear layer's parameters start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinearInit {
    /// `nn.Linear`'s: weight and bias U(±1/√in).
    Torch,
    /// `nn.Linear`'s weight, the bias zeroed (mad-lab's `_init_weights`).
    TorchZeroBias,
    /// Weight N(0, std²), bias 0 (GPT-2's and zoology's).
    Normal(f64),
}

impl LinearInit {
    /// (weight, bias) initialisers for a layer with `in_dim` inputs.
    fn inits(self, in_dim: usize) -> (Init, Init) {
        match self {
            Self::Torch => {
                let bound = Init::Uniform(1.0 / (in_dim as f64).sqrt());
                (bound, bound)
            }
            Self::TorchZeroBias => (Self::Torch.inits(in_dim).0, Init::Constant(0.0)),
            Self::Normal(std) => (Init::Normal(std), Init::Constant(0.0)),
        }
    }
}

/// y = x Wᵀ + b. Inputs of any rank are flattened to one matrix product (one large GEMM is
/// faster on CPU than a batch of small ones); see [`crate::ops::linear`]. In bf16 the product
/// takes bf16 operands and the bias is added in f32 ([`Precision::product`]).
pub struct Linear {
    /// (out, in), as `nn.Linear`.
    weight: Tensor,
    bias: Option<Tensor>,
    precision: Precision,
}

impl Linear {
    /// A new layer (with a bias if `bias`) started as `init` says.
    pub fn new(
        (in_dim, out_dim): (usize, usize),
        bias: bool,
        init: LinearInit,
        precision: Precision,
        params: &Params,
    ) -> Result<Self> {
        let (weight_init, bias_init) = init.inits(in_dim);
        let weight = params.get("weight", (out_dim, in_dim), weight_init)?;
        let bias = bias
            .then(|| params.get("bias", out_dim, bias_init))
            .transpose()?;
        Ok(Self::from_weight(weight, bias, precision))
    }

    /// A layer over an existing (out, in) weight, e.g. a tied embedding.
    pub fn from_weight(weight: Tensor, bias: Option<Tensor>, precision: Precision) -> Self {
        Self {
            weight,
            bias,
            precision,
        }
    }

    /// The layer restricted to output features `start..start + len`, sharing this layer's
    /// parameters: projecting q, k and v through slices of one fused weight gives each its own
    /// contiguous output, where narrowing one wide output makes candle copy it (and its
    /// backward assemble a full-width gradient from zeros) once per slice.
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        // The output features are the first dimension, after the replicas' if there are any.
        let dim = usize::from(self.replicated());
        Ok(Self {
            weight: self.weight.narrow(dim, start, len)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.narrow(dim, start, len))
                .transpose()?,
            precision: self.precision,
        })
    }

    /// Whether the weight is stacked for replicas, (R, out, in) (see `params.rs`).
    fn replicated(&self) -> bool {
        self.weight.rank() == 3
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.replicated() {
            let y = self
                .precision
                .product(x, &self.weight, |x, w| linear_replicas(x, w, None))?;
            return match &self.bias {
                Some(b) => add_bias_replicas(&y, b),
                None => Ok(y),
            };
        }
        if !self.precision.casts_operands(x.device()) {
            return linear(x, &self.weight, self.bias.as_ref());
        }
        let y = self
            .precision
            .product(x, &self.weight, |x, w| linear(x, w, None))?;
        match &self.bias {
            Some(b) => add_broadcast(&y, b),
            None => Ok(y),
        }
    }

    /// x (B, T, in) → (B, heads, T, out / heads): the output split into attention heads.
    pub fn forward_heads(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        if self.replicated() {
            let y = self.forward(x)?;
            let (b, t, out) = y.dims3()?;
            return Ok(y.reshape((b, t, heads, out / heads))?.transpose(1, 2)?);
        }
        if !self.precision.casts_operands(x.device()) {
            return linear_heads(x, &self.weight, self.bias.as_ref(), heads);
        }
        let y = self
            .precision
            .product(x, &self.weight, |x, w| linear_heads(x, w, None, heads))?;
        match &self.bias {
            // (out) → (heads, 1, out / heads), one row per head broadcast over positions.
            Some(b) => Ok(y.broadcast_add(&b.reshape((heads, 1, b.dim(0)? / heads))?)?),
            None => Ok(y),
        }
    }
}

/// LayerNorm over the last dimension (γ = 1, β = 0 at start), or RMSNorm (γ only) where the
/// layout says ([`Layout::rms_norm`]); ε = 1e-5 in both, as PyTorch's and mad-lab's.
pub struct Norm {
    weight: Tensor,
    /// β: LayerNorm's; `None` for RMSNorm.
    bias: Option<Tensor>,
}

impl Norm {
    const EPS: f64 = 1e-5;

    pub fn new(dim: usize, layout: Layout, params: &Params) -> Result<Self> {
        Ok(Self {
            weight: params.get("weight", dim, Init::Constant(1.0))?,
            bias: (!layout.rms_norm())
                .then(|| params.get("bias", dim, Init::Constant(0.0)))
                .transpose()?,
        })
    }

    /// The parameters of one norm of width `dim` in `layout`.
    pub fn parameters(dim: usize, layout: Layout) -> usize {
        if layout.rms_norm() { dim } else { 2 * dim }
    }

    /// With replicas, weight and bias are (R, dim), one row per replica.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(bias) => layer_norm(x, &self.weight, bias, Self::EPS),
            None => rms_norm(x, &self.weight, Self::EPS),
        }
    }
}

/// Token embedding: N(0, 1) like `nn.Embedding`, or N(0, 0.02) in the zoology layout.
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    pub fn new(vocab: usize, dim: usize, build: &Build, params: &Params) -> Result<Self> {
        Ok(Self {
            weight: params.get("weight", (vocab, dim), build.embedding_init())?,
        })
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// ids (B, T) u32 → (B, T, D). With replicas (a (R, V, D) table), the ids (R·B, T) of
    /// replica r's rows index its own table.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let Ok((replicas, vocab, d)) = self.weight.dims3() else {
            return crate::ops::embedding(&self.weight, ids);
        };
        let (rows, t) = ids.dims2()?;
        let offsets = (Tensor::arange(0u32, replicas as u32, ids.device())? * vocab as f64)?;
        let shifted = ids
            .reshape((replicas, rows / replicas * t))?
            .broadcast_add(&offsets.unsqueeze(1)?)?;
        let table = self.weight.reshape((replicas * vocab, d))?;
        crate::ops::embedding(&table, &shifted.reshape((rows, t))?)
    }
}

/// The channel mixer: Linear → GELU (erf as `nn.GELU()`, or its tanh approximation) →
/// Linear, or in the MAD layout SwiGLU, w3(silu(w1 x) ⊙ w2 x) without biases (mad-lab's
/// `mlp.py`, its parameter names).
pub enum Mlp {
    Gelu {
        up: Linear,
        activation: Activation,
        down: Linear,
    },
    SwiGlu {
        w1: Linear,
        w2: Linear,
        w3: Linear,
    },
}

impl Mlp {
    pub fn new(
        (dim, hidden): (usize, usize),
        activation: Activation,
        build: &Build,
        params: &Params,
    ) -> Result<Self> {
        if build.layout == Layout::Mad {
            let no_bias = |dims, residual, name: &str| {
                let init = build.linear_init(residual);
                Linear::new(dims, false, init, build.precision, &params.pp(name))
            };
            return Ok(Self::SwiGlu {
                w1: no_bias((dim, hidden), false, "w1")?,
                w2: no_bias((dim, hidden), false, "w2")?,
                w3: no_bias((hidden, dim), true, "w3")?,
            });
        }
        Ok(Self::Gelu {
            up: build.linear((dim, hidden), false, &params.pp("up"))?,
            activation,
            down: build.linear((hidden, dim), true, &params.pp("down"))?,
        })
    }

    /// The parameters of an MLP of `(dim, hidden)` in `layout`.
    pub fn parameters((dim, hidden): (usize, usize), layout: Layout) -> usize {
        match layout {
            Layout::Mad => 3 * dim * hidden,
            Layout::Attnlab | Layout::Zoology => 2 * dim * hidden + hidden + dim,
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Gelu {
                up,
                activation,
                down,
            } => {
                let hidden = up.forward(x)?;
                let hidden = match activation {
                    Activation::Gelu => gelu_erf(&hidden)?,
                    Activation::GeluTanh => gelu_tanh(&hidden)?,
                };
                down.forward(&hidden)
            }
            Self::SwiGlu { w1, w2, w3 } => {
                w3.forward(&silu_gate(&w2.forward(x)?, &w1.forward(x)?)?)
            }
        }
    }
}
