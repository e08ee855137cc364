//! What a layer does around its mechanism when the mechanism asks (the recurrent mixers): the
//! short convolutions over q, k and v before it ([`InputConv`]) and the head norm and gate
//! after it ([`HeadNorm`]). Both act on each position alone or on its past only, so the
//! mechanism's matrix is still the whole story of which tokens a position reads.

use candle_core::Tensor;

use super::{Build, Linear};
use crate::Result;
use crate::attention::OutputStage;
use crate::ops;
use crate::params::{Init, Params};

/// The parameters of [`OutputStage::HeadNorm`] and [`OutputStage::GatedHeadNorm`]: RMSNorm over
/// each head's outputs with a gain per channel (shared by the heads, as flash-linear-attention's
/// `FusedRMSNormGated`), times swish(W_g x) after it when gated, or with the heads' outputs
/// times silu(W_z x) before it (Mamba-2).
pub(super) struct HeadNorm {
    /// (Dh), or (R, Dh) for replicas.
    gain: Tensor,
    gate: Option<Linear>,
    /// Whether the gate acts before the norm (Mamba-2) rather than after it.
    gate_first: bool,
}

impl HeadNorm {
    /// FLA's epsilon for the gated RMSNorm.
    const EPS: f64 = 1e-5;

    pub(super) fn new(
        d_model: usize,
        width: usize,
        head_dim: usize,
        stage: OutputStage,
        build: &Build,
        params: &Params,
    ) -> Result<Self> {
        let (gated, gate_first) = match stage {
            OutputStage::HeadNorm { gated } => (gated, false),
            OutputStage::GatedHeadNorm => (true, true),
            OutputStage::Plain => (false, false),
        };
        Ok(Self {
            gate_first,
            gain: params
                .pp("head_norm")
                .get("weight", head_dim, Init::Constant(1.0))?,
            // No bias, as FLA's `g_proj`.
            gate: gated
                .then(|| {
                    let init = build.linear_init(false);
                    Linear::new(
                        (d_model, width),
                        false,
                        init,
                        build.precision,
                        &params.pp("gate"),
                    )
                })
                .transpose()?,
        })
    }

    /// y (B, T, H·Dh) normalised per head, gained and gated by x (B, T, D).
    pub(super) fn apply(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        if let (true, Some(gate)) = (self.gate_first, &self.gate) {
            return self.normalised(&ops::silu_gate(y, &gate.forward(x)?)?);
        }
        let normed = self.normalised(y)?;
        match &self.gate {
            Some(gate) => ops::silu_gate(&normed, &gate.forward(x)?),
            None => Ok(normed),
        }
    }

    /// y (B, T, H·Dh) through RMSNorm over each head, times the gain.
    fn normalised(&self, y: &Tensor) -> Result<Tensor> {
        let (b, t, width) = y.dims3()?;
        let dh = self.gain.dim(self.gain.rank() - 1)?;
        // Rows of one head's outputs; a replica's rows stay together, as its gain needs.
        let rows = y.reshape((b * t * width / dh, dh))?;
        Ok(ops::rms_norm(&rows, &self.gain, Self::EPS)?.reshape((b, t, width))?)
    }
}

/// The short causal convolutions over q, k and v that a mechanism asks for
/// ([`Mechanism::input_conv`]), each followed by silu: FLA's `ShortConvolution`, depthwise and
/// without a bias.
pub(super) struct InputConv {
    /// (k, channels) for q, k and v, or (R, k, channels) for replicas.
    kernels: [Tensor; 3],
}

impl InputConv {
    pub(super) fn new(size: usize, widths: [usize; 3], params: &Params) -> Result<Self> {
        // nn.Conv1d(groups = channels): fan_in = kernel size.
        let bound = Init::Uniform(1.0 / (size as f64).sqrt());
        let kernel = |name: &str, width: usize| params.get(name, (size, width), bound);
        Ok(Self {
            kernels: [
                kernel("q_conv.weight", widths[0])?,
                kernel("k_conv.weight", widths[1])?,
                kernel("v_conv.weight", widths[2])?,
            ],
        })
    }

    /// silu(conv(u)) for u (B, T, H·W) of block `which` (0 q, 1 k, 2 v), as (B, H, T, W).
    pub(super) fn apply(&self, which: usize, u: &Tensor, heads: usize) -> Result<Tensor> {
        ops::causal_conv_silu_heads(u, &self.kernels[which], heads)
    }
}
