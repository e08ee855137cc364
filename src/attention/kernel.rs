//! Kernel ("linear") attention in its quadratic view: A_ij = κ(q_i, k_j)·g_ij / Σ_n κ(q_i, k_n)·g_in,
//! where g = exp(mask + bias) is 1/0 for the causal mask and exp(b) for a relative bias.
//!
//! - `linear`: κ = φ(q)·φ(k), φ(x) = elu(x) + 1 (Katharopoulos et al. 2020, arXiv 2006.16236).
//! - `based`: κ = 1 + s + s²/2, s = q·k/√d_f, the Taylor kernel of zoology's Based
//!   (Arora et al. 2024, arXiv 2402.18668); its minimum is 0.5 at s = −1.
//! - `rebased`: κ = s², s = q'·k'/√d_f with q' = γ_Q ⊙ norm(q) + β_Q (same for k), the
//!   normalisation taken over all heads' features at once, as the authors' code does
//!   (corl-team/rebased `src/mixers/rebased.py`; Aksenov et al. 2024, arXiv 2402.10644).
//!   The paper's ablations are the other [`RebasedVariant`]s.
//!
//! The quadratic view is what the views show. Long evaluation ([`Mechanism::output_blocks`])
//! uses the same function in its chunked-cumulative (recurrent) form, φ(q_i)ᵀ Σ_{j≤i} φ(k_j) v_jᵀ
//! over φ(q_i)·Σ_{j≤i} φ(k_j), with the explicit feature maps of the three kernels; encodings with
//! a bias (or ReRoPE) keep the quadratic form, evaluated over blocks of queries.

use std::sync::Arc;

use candle_core::{D, Tensor};
use serde::{Deserialize, Serialize};

use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    StateShape, StateSize, Variant,
};
use crate::Result;
use crate::encodings::{Encoding, LengthCache, QueryBlock};
use crate::ops::{
    Combine, Precision, RowFunction, RowKernel, RowNorm, WeightDropout, add_bias_replicas,
    affine_replicas, causal_mask, cpu_attention, cpu_attention_available, dot_scores, kernel_rows,
    layer_norm, normalise, normalise_rows, with_bias,
};
use crate::params::{Init, Params};
use crate::settings::{Choices, Hyperparameter, Settings, Switch, real};

/// Linear attention's settings (none yet).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearConfig {}

static LINEAR_FACTS: Facts = Facts {
    name: "linear",
    formula: "A_ij = phi(q_i).phi(k_j) / sum_n phi(q_i).phi(k_n), phi = elu + 1",
    summary: "Katharopoulos et al. 2020: a kernel feature map, O(n) recurrent form.",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::RowStochastic,
    state: "S = sum phi(k) v^T and z = sum phi(k): H d_k d_v + H d_k",
    settings: Settings::NONE,
    default: || MechanismSpec::Linear(LinearConfig::default()),
};

impl Variant for LinearConfig {
    const FACTS: &'static Facts = &LINEAR_FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        kernel(KernelKind::Linear, shape, params)
    }

    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        MemoryTerms::plain(layer)
    }

    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        Some(StateSize::same(feature_state(layer, layer.qk_dim)))
    }
}

/// A layer of kernel attention with `kind`'s kernel.
fn kernel(kind: KernelKind, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
    Ok(Arc::new(KernelAttention::new(kind, shape, params)?))
}

/// The recurrent state of a kernel mechanism whose feature map has `features` entries per
/// head: Σ φ(k) vᵀ (features × d_v) and the normaliser Σ φ(k), per head.
fn feature_state(layer: &StateShape, features: usize) -> usize {
    layer.heads * features * (layer.head_dim + 1)
}

/// Based settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BasedConfig {
    /// Width d_f of q and k per head (zoology's configs use 8, 16, 24).
    pub feature_dim: usize,
}

impl Default for BasedConfig {
    fn default() -> Self {
        Self { feature_dim: 16 }
    }
}

static BASED_FACTS: Facts = Facts {
    name: "based",
    formula: "A_ij ~ 1 + s + s^2/2, s = q_i.k_j / sqrt(d_f)",
    summary: "Arora et al. 2024: Taylor kernel; better recall than linear.",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::RowStochastic,
    state: "H d_v E + H E over the features, E = 1 + f + f^2 (zoology: E = f(f+1)/2 + f + 1)",
    settings: Settings::of(&[FEATURE_DIM]),
    default: || MechanismSpec::Based(BasedConfig::default()),
};

impl Variant for BasedConfig {
    const FACTS: &'static Facts = &BASED_FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        kernel(KernelKind::Based, shape, params)
    }

    /// The 2nd-order Taylor features: 1, x and x ⊗ x.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        MemoryTerms {
            features: 1.0 + layer.qk + layer.qk * layer.qk,
            ..MemoryTerms::plain(layer)
        }
    }

    fn qk_dim(&self, _head_dim: usize) -> usize {
        self.feature_dim
    }

    /// attnlab's features are 1, x and x ⊗ x; zoology keeps the symmetric half of x ⊗ x.
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        let f = self.feature_dim;
        Some(StateSize {
            floats: feature_state(layer, 1 + f + f * f),
            zoology: feature_state(layer, f * (f + 1) / 2 + f + 1),
        })
    }
}

const FEATURE_DIM: Hyperparameter = real(
    "feature_dim",
    1.0,
    256.0,
    "width d_f of q and k per head (zoology's configs use 8, 16, 24)",
)
.whole();

/// ReBased settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RebasedConfig {
    /// Width d_f of q and k per head (the paper's MQAR runs use 16).
    pub feature_dim: usize,
    /// What is applied to q and k before squaring; `rebased` is the paper's final model.
    pub variant: RebasedVariant,
}

impl Default for RebasedConfig {
    fn default() -> Self {
        Self {
            feature_dim: 16,
            variant: RebasedVariant::Rebased,
        }
    }
}

static REBASED_FACTS: Facts = Facts {
    name: "rebased",
    formula: "A_ij ~ (q'_i.k'_j / sqrt(d_f))^2, q' = gamma*norm(q) + beta",
    summary: "Aksenov et al. 2024: learnable kernel; better recall than Based.",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::RowStochastic,
    state: "H d_v E + H E over the features, E = f^2 (zoology-style: E = f(f+1)/2)",
    settings: Settings {
        numbers: &[FEATURE_DIM],
        switches: &[Switch {
            key: "variant",
            label: "variant",
            choices: Choices::Words(&["rebased", "x2", "norm", "gamma", "gamma-beta"]),
        }],
    },
    default: || MechanismSpec::Rebased(RebasedConfig::default()),
};

impl Variant for RebasedConfig {
    const FACTS: &'static Facts = &REBASED_FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        kernel(KernelKind::Rebased(self.variant), shape, params)
    }

    /// Feature norms of queries and keys (at most a weight and a bias each), squared
    /// features; the norm runs over all heads' features: copies of both, standardised,
    /// scaled and back in head order.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        MemoryTerms {
            parameters: 4.0 * layer.heads * layer.qk,
            features: layer.qk * layer.qk,
            norms: 6.0 * layer.heads * layer.qk,
            ..MemoryTerms::plain(layer)
        }
    }

    fn qk_dim(&self, _head_dim: usize) -> usize {
        self.feature_dim
    }

    /// `rebased-<variant>` for the paper's ablations.
    fn label(&self) -> String {
        match self.variant {
            RebasedVariant::Rebased => REBASED_FACTS.name.to_string(),
            other => format!("{}-{other:?}", REBASED_FACTS.name).to_lowercase(),
        }
    }

    /// The features are x ⊗ x (κ = s² has no constant or linear term); counted
    /// symmetrically, as zoology counts Based's, they are f(f + 1)/2.
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        let f = self.feature_dim;
        Some(StateSize {
            floats: feature_state(layer, f * f),
            zoology: feature_state(layer, f * (f + 1) / 2),
        })
    }
}

/// The ablation ladder of the ReBased paper (Table 1), as the authors' flags implement it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebasedVariant {
    /// (γ ⊙ norm(x) + β)²: LayerNorm with its affine part (the paper's ReBased).
    #[default]
    Rebased,
    /// x²: the square kernel alone.
    X2,
    /// norm(x)²: normalisation without affine parameters.
    Norm,
    /// (γ ⊙ x)²: a learnable scale only.
    Gamma,
    /// (γ ⊙ x + β)²: learnable scale and shift, no normalisation.
    GammaBeta,
}

/// Which kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    Linear,
    Based,
    Rebased(RebasedVariant),
}

/// The learnable pre-kernel map of one of q, k (ReBased family only).
struct FeatureNorm {
    normalise: bool,
    gamma: Option<Tensor>,
    beta: Option<Tensor>,
}

impl FeatureNorm {
    fn new(variant: RebasedVariant, width: usize, params: &Params) -> Result<Self> {
        let (normalise, gamma, beta) = match variant {
            RebasedVariant::Rebased => (true, true, true),
            RebasedVariant::X2 => (false, false, false),
            RebasedVariant::Norm => (true, false, false),
            RebasedVariant::Gamma => (false, true, false),
            RebasedVariant::GammaBeta => (false, true, true),
        };
        Ok(Self {
            normalise,
            gamma: gamma
                .then(|| params.get("weight", width, Init::Constant(1.0)))
                .transpose()?,
            beta: beta
                .then(|| params.get("bias", width, Init::Constant(0.0)))
                .transpose()?,
        })
    }

    /// x (B, H, T, f) → the same shape, normalised over the H·f features of each position.
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let (b, h, t, f) = x.dims4()?;
        let mut y = x.transpose(1, 2)?.reshape((b, t, h * f))?; // (B, T, H·f)
        // Replicas hold (R, H·f) parameters, one row per replica's block of positions; a lone
        // model's (H·f) are one replica's. Both take the fused per-replica ops: candle's
        // broadcast reduced γ's gradient with a strided loop that was a third of a lone step.
        let per_replica = |p: &Tensor| match p.rank() {
            1 => p.unsqueeze(0),
            _ => Ok(p.clone()),
        };
        if let (true, Some(gamma), Some(beta)) = (self.normalise, &self.gamma, &self.beta) {
            let y = layer_norm(&y, &per_replica(gamma)?, &per_replica(beta)?, 1e-5)?;
            return Ok(y.reshape((b, t, h, f))?.transpose(1, 2)?.contiguous()?);
        }
        if self.normalise {
            y = normalise(&y, RowNorm::Standard, 1e-5)?;
        }
        match (&self.gamma, &self.beta) {
            (Some(gamma), beta) => {
                let beta = beta.as_ref().map(per_replica).transpose()?;
                y = affine_replicas(&y, &per_replica(gamma)?, beta.as_ref())?;
            }
            (None, Some(beta)) => y = add_bias_replicas(&y, &per_replica(beta)?)?,
            (None, None) => {}
        }
        Ok(y.reshape((b, t, h, f))?.transpose(1, 2)?.contiguous()?) // (B, H, T, f)
    }
}

/// Linear attention's feature map φ(x) = elu(x) + 1.
fn elu_plus_one(x: &Tensor) -> Result<Tensor> {
    Ok((x.elu(1.0)? + 1.0)?)
}

pub struct KernelAttention {
    kind: KernelKind,
    scale: f64,
    precision: Precision,
    norms: Option<(FeatureNorm, FeatureNorm)>,
    /// The additive causal mask per length.
    masks: LengthCache,
}

impl KernelAttention {
    pub fn new(kind: KernelKind, shape: &MechanismShape, params: &Params) -> Result<Self> {
        let width = shape.n_heads * shape.qk_dim;
        let norms = match kind {
            KernelKind::Rebased(variant) => Some((
                FeatureNorm::new(variant, width, &params.pp("q_norm"))?,
                FeatureNorm::new(variant, width, &params.pp("k_norm"))?,
            )),
            _ => None,
        };
        Ok(Self {
            kind,
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            precision: shape.precision,
            norms,
            masks: LengthCache::default(),
        })
    }

    /// The scores κ is applied to, (B, H, T, T) before masking: φ(q)·φ(k) for linear
    /// attention, q·k/√d_f for Based and ReBased.
    fn scores(&self, q: &Tensor, k: &Tensor) -> Result<Tensor> {
        match self.kind {
            KernelKind::Linear => {
                let (phi_q, phi_k) = (elu_plus_one(q)?, elu_plus_one(k)?);
                self.precision
                    .product(&phi_q, &phi_k, |q, k| dot_scores(q, k, 1.0))
            }
            KernelKind::Based | KernelKind::Rebased(_) => self
                .precision
                .product(q, k, |q, k| dot_scores(q, k, self.scale)),
        }
    }

    /// q and k through ReBased's feature norms (unchanged for the other kernels).
    fn normalised(&self, q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok(match &self.norms {
            Some((q_norm, k_norm)) => (q_norm.apply(q)?, k_norm.apply(k)?),
            None => (q.clone(), k.clone()),
        })
    }

    /// κ as a function of the score.
    fn row_kernel(&self) -> RowKernel {
        match self.kind {
            KernelKind::Linear => RowKernel::Identity,
            KernelKind::Based => RowKernel::Taylor,
            KernelKind::Rebased(_) => RowKernel::Square,
        }
    }

    /// Row-normalised κ·exp(mask + bias) for the block's queries, as tensor ops: with a bias,
    /// the gate is exp(b) on the visible keys. The masks of whole sequences are cached.
    fn biased_weights(&self, scores: &Tensor, bias: &Tensor, block: QueryBlock) -> Result<Tensor> {
        let mask = if block == QueryBlock::whole(block.total) {
            self.masks.get_or(block.total, || causal_mask(scores))?
        } else {
            causal_mask(scores)?
        };
        let gate = bias.broadcast_add(&mask)?.exp()?;
        normalise_rows(&with_bias(
            &self.row_kernel().apply(scores)?,
            &gate,
            Combine::Mul,
        )?)
    }

    /// Row-normalised κ·g for the block's queries. κ is applied after the encoding has
    /// combined the scores: it commutes with ReRoPE's choice of one of two scores per entry,
    /// the only combination an encoding makes.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
        bias: Option<Tensor>,
    ) -> Result<Attention> {
        let (q, k) = self.normalised(q, k)?;
        let scores = pos.block_scores(&q, &k, block, &|q, k| self.scores(q, k))?;
        let weights = match bias {
            Some(bias) => self.biased_weights(&scores, &bias, block)?,
            None => kernel_rows(&scores, self.row_kernel())?,
        };
        Ok(Attention {
            weights,
            values: v.clone(),
        })
    }
}

impl KernelAttention {
    /// φ with κ(q, k) = φ(q)·φ(k): elu + 1 (linear); [1, √c·x, c·(x⊗x)/√2] with c the score
    /// scale (Based, 1 + s + s²/2); c·(x⊗x) (ReBased, s²). x (B, H, T, f) → (B, H, T, F).
    fn features(&self, x: &Tensor) -> Result<Tensor> {
        let outer = |x: &Tensor| -> Result<Tensor> {
            let (b, h, t, f) = x.dims4()?;
            Ok(x.unsqueeze(4)?
                .broadcast_mul(&x.unsqueeze(3)?)?
                .reshape((b, h, t, f * f))?)
        };
        Ok(match self.kind {
            KernelKind::Linear => elu_plus_one(x)?,
            KernelKind::Based => {
                let ones = x.narrow(3, 0, 1)?.ones_like()?;
                let linear = (x * self.scale.sqrt())?;
                let square = (outer(x)? * (self.scale / 2f64.sqrt()))?;
                Tensor::cat(&[&ones, &linear, &square], 3)?
            }
            KernelKind::Rebased(_) => (outer(x)? * self.scale)?,
        })
    }

    /// The chunked-cumulative (recurrent) form, O(T·chunk) time and no T×T matrix: per block,
    /// the running sums S = Σ φ(k_j) v_jᵀ and z = Σ φ(k_j) over earlier blocks plus the block's
    /// own causal part. `None` when the encoding adds a bias or does not act on q and k alone
    /// (ReRoPE): those take the blockwise quadratic form.
    fn recurrent_output(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        chunk: usize,
    ) -> Result<Option<Tensor>> {
        let t = q.dim(2)?;
        if pos.has_logit_bias() {
            return Ok(None);
        }
        let (q, k) = self.normalised(q, k)?;
        let Some((q, k)) = pos.positioned(&q, &k)? else {
            return Ok(None);
        };
        let (fq, fk) = (self.features(&q)?, self.features(&k)?);
        let (b, h, _, f) = fq.dims4()?;
        let mut state = Tensor::zeros((b, h, f, v.dim(3)?), v.dtype(), v.device())?;
        let mut total = Tensor::zeros((b, h, f, 1), v.dtype(), v.device())?;
        let mut outputs = Vec::new();
        for block in QueryBlock::cover(t, chunk) {
            let rows = |x: &Tensor| x.narrow(2, block.start, block.len)?.contiguous();
            let (qc, kc, vc) = (rows(&fq)?, rows(&fk)?, rows(v)?);
            let own = qc.matmul(&kc.t()?)?;
            let own = own.broadcast_mul(&causal_mask(&own)?.exp()?)?; // (B, H, len, len)
            let numerator = (own.matmul(&vc)? + qc.matmul(&state)?)?;
            let denominator = (own.sum_keepdim(D::Minus1)? + qc.matmul(&total)?)?;
            outputs.push(numerator.broadcast_div(&(denominator + 1e-12)?)?);
            state = (state + kc.t()?.matmul(&vc)?)?;
            total = (total + kc.sum_keepdim(2)?.t()?)?;
        }
        Ok(Some(Tensor::cat(&outputs, 2)?))
    }
}

impl Mechanism for KernelAttention {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, pos: &dyn Encoding) -> Result<Attention> {
        let t = q.dim(2)?;
        self.attention(q, k, v, pos, QueryBlock::whole(t), pos.logit_bias(t)?)
    }

    /// On the CPU, without a bias and in f32: [`cpu_attention`] on the normalised, positioned
    /// q and k (φ applied first for linear attention).
    fn fused_output(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        dropout: Option<WeightDropout>,
    ) -> Result<Option<Tensor>> {
        if !cpu_attention_available(q, v)
            || self.precision == Precision::Bf16
            || pos.has_logit_bias()
        {
            return Ok(None);
        }
        let (q, k) = self.normalised(q, k)?;
        let Some((q, k)) = pos.positioned(&q, &k)? else {
            return Ok(None);
        };
        let (q, k, scale) = match self.kind {
            KernelKind::Linear => (elu_plus_one(&q)?, elu_plus_one(&k)?, 1.0),
            KernelKind::Based | KernelKind::Rebased(_) => (q, k, self.scale),
        };
        let row = RowFunction::Kernel(self.row_kernel());
        Ok(Some(cpu_attention(&q, &k, v, (row, None), scale, dropout)?))
    }

    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
    ) -> Result<Attention> {
        self.attention(q, k, v, pos, block, pos.block_bias(block)?)
    }

    fn output_blocks(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        chunk: usize,
    ) -> Result<Tensor> {
        match self.recurrent_output(q, k, v, pos, chunk)? {
            Some(output) => Ok(output),
            None => super::blockwise_output(self, q, k, v, pos, chunk),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::NoEncoding;
    use candle_core::Device;

    fn shape() -> MechanismShape {
        MechanismShape {
            n_heads: 1,
            qk_dim: 1,
            head_dim: 1,
            max_len: 8,
            precision: Precision::F32,
        }
    }

    /// With one feature, Based's kernel is 1 + s + s²/2 and has its floor 0.5 at s = −1.
    #[test]
    fn based_kernel_is_the_taylor_polynomial() {
        let p = Params::new(0, &Device::Cpu);
        let att = KernelAttention::new(KernelKind::Based, &shape(), &p).unwrap();
        let q = Tensor::new(&[[[[-1f32], [2.0]]]], &Device::Cpu).unwrap();
        let k = Tensor::new(&[[[[1f32], [1.0]]]], &Device::Cpu).unwrap();
        let kern = att
            .row_kernel()
            .apply(&att.scores(&q, &k).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(kern, vec![0.5, 0.5, 5.0, 5.0]);
    }

    /// The recurrent form equals the explicit weights · values, for every kernel and with RoPE.
    #[test]
    fn recurrent_form_equals_the_explicit_matrix() {
        let shape = MechanismShape {
            n_heads: 2,
            qk_dim: 4,
            head_dim: 3,
            max_len: 16,
            precision: Precision::F32,
        };
        let random = |seed, d| {
            let data =
                crate::rng::normal_vec(&mut crate::rng::stream(seed, "kernel"), 2 * 2 * 7 * d, 1.0);
            Tensor::from_vec(data, (2, 2, 7, d), &Device::Cpu).unwrap()
        };
        let (q, k, v) = (random(1, 4), random(2, 4), random(3, 3));
        let rope = crate::encodings::EncodingSpec::Rope(Default::default());
        let enc_shape = crate::encodings::EncodingShape {
            d_model: 8,
            n_heads: 2,
            qk_dim: 4,
            max_len: 16,
            embedding_std: 1.0,
        };
        let p = Params::new(0, &Device::Cpu);
        let rope = rope.build(&enc_shape, &p).unwrap();
        for kind in [
            KernelKind::Linear,
            KernelKind::Based,
            KernelKind::Rebased(RebasedVariant::Rebased),
        ] {
            let att = KernelAttention::new(kind, &shape, &p.pp(format!("{kind:?}"))).unwrap();
            for pos in [&NoEncoding as &dyn Encoding, rope.as_ref()] {
                let explicit = att.attend(&q, &k, &v, pos).unwrap();
                let explicit = explicit.weights.matmul(&explicit.values).unwrap();
                let recurrent = att.recurrent_output(&q, &k, &v, pos, 3).unwrap().unwrap();
                let diff = (explicit - recurrent)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(diff < 1e-4, "{kind:?}: {diff}");
            }
        }
    }

    #[test]
    fn rebased_x2_kernel_can_reach_zero_weight() {
        let p = Params::new(0, &Device::Cpu);
        let att =
            KernelAttention::new(KernelKind::Rebased(RebasedVariant::X2), &shape(), &p).unwrap();
        let q = Tensor::new(&[[[[1f32], [1.0]]]], &Device::Cpu).unwrap();
        let k = Tensor::new(&[[[[0f32], [3.0]]]], &Device::Cpu).unwrap();
        let v = Tensor::new(&[[[[1f32], [2.0]]]], &Device::Cpu).unwrap();
        let a = att.attend(&q, &k, &v, &NoEncoding).unwrap();
        let w = a.weights.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // row 1: κ = (0, 9) → weights (0, 1); row 0 sees only key 0 with κ = 0 → all-zero row.
        assert_eq!(&w[2..], &[0.0, 1.0]);
    }
}
