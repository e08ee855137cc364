//! Attention mechanisms: how queries and keys become mixing weights.
//!
//! Every mechanism returns its **explicit, row-normalised attention matrix** together with the
//! values it mixes, and the model output is `weights · values`. So the heatmaps, ERF, IoU and
//! spectra see exactly the matrix the model used, for every mechanism (n×k for Linformer).
//!
//! | name | weights A_ij (j ≤ i unless non-causal) |
//! |---|---|
//! | `softmax` | exp(q_i·k_j/√d + b_ij) / Σ_n … |
//! | `linear` | φ(q_i)·φ(k_j) / Σ_n …, φ = elu + 1 (Katharopoulos et al. 2020) |
//! | `based` | 1 + s + s²/2 with s = q_i·k_j/√d_f, normalised (Arora et al. 2024) |
//! | `rebased` | (q'_i·k'_j/√d_f)², q' = γ⊙norm(q)+β, normalised (Aksenov et al. 2024) |
//! | `linformer` | softmax(q_i·(E K)_j/√d) over k projected positions (Wang et al. 2020) |
//!
//! attnlab's choice for kernel mechanisms with a relative-bias encoding: the bias multiplies
//! the kernel as exp(b_ij), the same "bias = log-weight" meaning it has inside softmax.

mod catalogue;
mod deltanet;
mod gla;
mod kernel;
mod linformer;
mod mamba2;
mod recurrent;
mod retention;
mod softmax;
mod weights;

use std::sync::Arc;

use candle_core::Tensor;

pub use catalogue::{
    CATALOGUE, Facts, LayerSize, MechanismSpec, MemoryTerms, StateShape, StateSize, Variant,
};
pub use deltanet::{DeltaNet, DeltaNetConfig, GatedDeltaNetConfig};
pub use gla::{Gla, GlaConfig};
pub use kernel::{
    BasedConfig, KernelAttention, KernelKind, LinearConfig, RebasedConfig, RebasedVariant,
};
pub use linformer::{Linformer, LinformerConfig, LinformerSharing};
pub use mamba2::{Mamba2, Mamba2Config};
pub use retention::{Retention, RetentionConfig};
pub use softmax::{SoftmaxAttention, SoftmaxConfig, WindowLayers};
pub use weights::AttentionWeights;

use crate::Result;
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::WeightDropout;

/// What kind of matrix a mechanism's weights are: every view draws it, and the analyses that
/// read rows as distributions (IoU, entropy, ERF) take |A| row-normalised for a signed one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixing {
    /// Rows are non-negative and sum to 1 (softmax, linear, Based, ReBased, Linformer).
    RowStochastic,
    /// Entries of either sign, rows of any sum: the hidden attention of a recurrent mixer
    /// (RetNet's retention), O = A·V before a per-head norm.
    Signed,
}

/// What a layer does to its heads' outputs (B, T, H·Dh) before the output projection. It acts
/// on each position alone, so the mixing matrix the views show is still the whole story of
/// which tokens a position reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputStage {
    /// The heads' outputs as they are.
    Plain,
    /// RMSNorm over each head's outputs (a learned gain per channel, shared by the heads),
    /// then, when gated, times swish(W_g x) of the layer's input (RetNet, GLA, DeltaNet).
    HeadNorm { gated: bool },
    /// The heads' outputs times silu(W_z x), then RMSNorm over each head (Mamba-2's
    /// `norm_before_gate = False`).
    GatedHeadNorm,
}

/// The attention of one layer on one batch.
pub struct Attention {
    /// The mixing matrix, (B, H, Tq, Tk): row-normalised, or signed for the mechanisms whose
    /// facts say [`Mixing::Signed`].
    pub weights: Tensor,
    /// The values the weights mix, (B, H, Tk, Dh), possibly a strided view of the model's
    /// (B, T, H, Dh) projection. `ops::matmul(weights, values)` is the layer's output.
    pub values: Tensor,
}

/// How scores become weights.
pub trait Mechanism: Send + Sync {
    /// q, k (B, H, T, Dqk) and v (B, H, T, Dh), projected but not yet positioned; calls the
    /// encoding's hooks itself.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: &dyn Encoding) -> Result<Attention>;

    /// The attention of one block of queries (q holds its rows) over the causal prefix of keys
    /// and values `0..block.keys()`: weights (B, H, len, keys). Evaluating a long sequence block
    /// by block never holds the n×n matrix; rows equal those of [`Mechanism::attend`].
    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
    ) -> Result<Attention>;

    /// The layer's output with the heads side by side, (B, T, H·Dh), for training, where the
    /// mechanism has a kernel that never builds the weights for these inputs (softmax on a CUDA
    /// GPU with `ATTNLAB_CUDA_FLASH=1`: flash attention; softmax and the kernels on the CPU:
    /// [`crate::ops::cpu_attention`]);
    /// `None` otherwise, and the caller uses [`Mechanism::attend`]. Equal to `attend`'s weights,
    /// with `dropout` applied, · values; the views and analyses always call `attend`.
    fn fused_output(
        &self,
        _q: &Tensor,
        _k: &Tensor,
        _v: &Tensor,
        _pos: &dyn Encoding,
        _dropout: Option<WeightDropout>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }

    /// What the layer does to the heads' outputs before its output projection.
    fn output_stage(&self) -> OutputStage {
        OutputStage::Plain
    }

    /// The kernel size of the short causal convolution (depthwise, no bias) that the layer
    /// applies to each of q, k and v before handing them over, each then through silu
    /// (DeltaNet's `ShortConvolution`); `None` for none.
    fn input_conv(&self) -> Option<usize> {
        None
    }

    /// How many per-token inputs it reads from the layer's input x besides q, k and v (GLA's
    /// low-rank gate code): the layer projects them with q, k and v, in the last columns of its
    /// fused projection, and hands them over through [`Mechanism::with_token_inputs`].
    fn token_inputs(&self) -> usize {
        0
    }

    /// This mechanism bound to one input's per-token inputs (B, T, [`Mechanism::token_inputs`]):
    /// what the layer calls `attend` and the rest on for that input. Only called when
    /// `token_inputs` is not 0.
    fn with_token_inputs(&self, _inputs: &Tensor) -> Result<Arc<dyn Mechanism>> {
        Err(crate::Error::Internal(
            "this mechanism reads no per-token inputs".into(),
        ))
    }

    /// The outputs (B, H, T, Dh) of a whole sequence, computed `chunk` queries at a time, so
    /// at most chunk × T weights per head exist at once (kernel mechanisms use their
    /// recurrent form where it exists). Equal to `attend`'s weights · values.
    fn output_blocks(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        chunk: usize,
    ) -> Result<Tensor> {
        blockwise_output(self, q, k, v, pos, chunk)
    }
}

/// [`Mechanism::output_blocks`] by [`Mechanism::attend_block`] on each block of queries.
pub fn blockwise_output<M: Mechanism + ?Sized>(
    mechanism: &M,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pos: &dyn Encoding,
    chunk: usize,
) -> Result<Tensor> {
    let rows =
        |x: &Tensor, start, len| -> Result<Tensor> { Ok(x.narrow(2, start, len)?.contiguous()?) };
    let outputs = QueryBlock::cover(q.dim(2)?, chunk)
        .map(|block| {
            let keys = block.keys();
            let attention = mechanism.attend_block(
                &rows(q, block.start, block.len)?,
                &rows(k, 0, keys)?,
                &rows(v, 0, keys)?,
                pos,
                block,
            )?;
            Ok(crate::ops::matmul(&attention.weights, &attention.values)?.detach())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outputs, 2)?)
}

impl MechanismSpec {
    /// Every mechanism with its default settings, for pickers and tests that loop over all.
    pub fn all_defaults() -> Vec<Self> {
        CATALOGUE.iter().map(|facts| (facts.default)()).collect()
    }

    /// The name used in presets, the CLI, the GUI and file names.
    pub fn name(&self) -> &'static str {
        self.facts().name
    }

    /// One-line formula for help and tooltips.
    pub fn formula(&self) -> &'static str {
        self.facts().formula
    }

    /// Where the mechanism comes from and what it trades, for tooltips and help.
    pub fn summary(&self) -> &'static str {
        self.facts().summary
    }

    /// Whether every position sees only itself and earlier positions.
    pub fn is_causal(&self) -> bool {
        self.facts().causal
    }

    /// What kind of matrix its weights are.
    pub fn mixing(&self) -> Mixing {
        self.facts().mixing
    }

    /// The mechanism of model layer `layer`: itself, softmax's window only on the layers its
    /// `window_layers` names.
    pub fn at_layer(&self, layer: usize) -> Self {
        match self {
            Self::Softmax(config) => Self::Softmax(config.at_layer(layer)),
            other => other.clone(),
        }
    }
}

/// What a mechanism needs to know about its layer.
#[derive(Clone, Copy, Debug)]
pub struct MechanismShape {
    pub n_heads: usize,
    pub qk_dim: usize,
    pub head_dim: usize,
    pub max_len: usize,
    /// How its score products compute.
    pub precision: crate::ops::Precision,
}
