//! Linear, LayerNorm, Embedding and MLP, written with differentiable ops only and initialised
//! like PyTorch's modules (so `attnlab bench` and the PyTorch reference start alike).

use candle_core::Tensor;

use crate::Result;
use crate::ops::{Precision, add_broadcast, gelu_erf, layer_norm, linear, linear_heads};
use crate::params::{Init, Params};

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
    /// U(±1/√in) for weight and bias, as `nn.Linear`.
    pub fn new(
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        precision: Precision,
        params: &Params,
    ) -> Result<Self> {
        let bound = 1.0 / (in_dim as f64).sqrt();
        let weight = params.get("weight", (out_dim, in_dim), Init::Uniform(bound))?;
        let bias = bias
            .then(|| params.get("bias", out_dim, Init::Uniform(bound)))
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
        Ok(Self {
            weight: self.weight.narrow(0, start, len)?,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.narrow(0, start, len))
                .transpose()?,
            precision: self.precision,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.precision != Precision::Bf16 {
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
        if self.precision != Precision::Bf16 {
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

/// LayerNorm over the last dimension, γ = 1, β = 0 at start, ε = 1e-5.
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    pub fn new(dim: usize, params: &Params) -> Result<Self> {
        Ok(Self {
            weight: params.get("weight", dim, Init::Constant(1.0))?,
            bias: params.get("bias", dim, Init::Constant(0.0))?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        layer_norm(x, &self.weight, &self.bias, 1e-5)
    }
}

/// Token embedding, N(0, 1) like `nn.Embedding`.
pub struct Embedding {
    weight: Tensor,
}

impl Embedding {
    pub fn new(vocab: usize, dim: usize, params: &Params) -> Result<Self> {
        Ok(Self {
            weight: params.get("weight", (vocab, dim), Init::Normal(1.0))?,
        })
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// ids (B, T) u32 → (B, T, D).
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        crate::ops::embedding(&self.weight, ids)
    }
}

/// Linear → GELU (erf, as `nn.GELU()`) → Linear.
pub struct Mlp {
    up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn new(dim: usize, hidden: usize, precision: Precision, params: &Params) -> Result<Self> {
        Ok(Self {
            up: Linear::new(dim, hidden, true, precision, &params.pp("up"))?,
            down: Linear::new(hidden, dim, true, precision, &params.pp("down"))?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down.forward(&gelu_erf(&self.up.forward(x)?)?)
    }
}
