//! Gated linear attention (GLA; Yang et al. 2023, arXiv 2312.06635), as flash-linear-attention
//! computes it (`fla/layers/gla.py`, `fla/ops/gla/naive.py`). Per head, with a gate per key
//! channel read from the layer's input:
//!
//! - gate: log α_t = logsigmoid(W₂ W₁ x_t + b) / 16, W₁: d → 16 (the layer's fused projection,
//!   [`Mechanism::token_inputs`]), W₂: 16 → d_k with a bias; at init α ≈ 0.958;
//! - recurrent (the truth): S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t / √d_k;
//! - explicit (the views): A_ij = Σ_c q_ic k_jc exp(b_ic − b_jc) / √d_k for j ≤ i, with
//!   b = cumsum log α: signed, and not a product of one query and one key feature map. It is
//!   summed pair by pair (never exp(±b) alone, which overflows f32 within ~70 steps);
//! - chunked (training, long evaluation): within a chunk, q and k scaled by exp(±(b − b_a))
//!   about the position a before the chunk, so every factor stays within e^(chunk · 1.25) at the
//!   gate's floor; across chunks the state carried as Σ_j exp(b_a − b_j) k_j v_jᵀ.
//!
//! Then RMSNorm over each head times swish(W_g x) ([`OutputStage::HeadNorm`]). FLA's layer has
//! d_k = d_v / 2 (`expand_k` 0.5, the default here); MAD's GLA uses `expand_k` 1. Positions:
//! GLA has none of its own; an encoding in the slot acts as it does for the kernel mechanisms.

use std::sync::Arc;

use candle_core::{D, Tensor};
use serde::{Deserialize, Serialize};

use super::recurrent::{positioned_for_chunks, read_scores};
use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    OutputStage, StateShape, StateSize, Variant,
};
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::{self, causal_mask, channel_decayed_attention, linear, linear_replicas};
use crate::params::{Init, Params};
use crate::settings::{Choices, Settings, Switch, real};
use crate::{Error, Result};

/// GLA's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GlaConfig {
    /// Query/key width per head as a share of the value width (FLA 0.5, MAD 1).
    pub expand_k: f64,
    /// Rank of the gate's projection W₂ W₁ (FLA's `gate_low_rank_dim`).
    pub gate_rank: usize,
    /// What log-sigmoid of the gate is divided by (FLA's `gate_logit_normalizer`).
    pub normaliser: f64,
    /// The swish output gate after the head norm.
    pub gate: bool,
    /// Queries per chunk of the chunked form that trains.
    pub chunk: usize,
}

impl Default for GlaConfig {
    fn default() -> Self {
        Self {
            expand_k: 0.5,
            gate_rank: 16,
            normaliser: 16.0,
            gate: true,
            chunk: 16,
        }
    }
}

static FACTS: Facts = Facts {
    name: "gla",
    formula: "A_ij = sum_c q_ic k_jc exp(b_ic - b_jc) / sqrt(d_k), j <= i, b = cumsum log alpha, \
              log alpha = logsigmoid(W2 W1 x + b) / 16 (signed); y = RMSNorm_head(A v) * swish(W_g x)",
    summary: "Yang et al. 2023: linear attention with a data-dependent decay per key channel; \
              trains chunkwise, runs as a recurrence with an H d_k d_v state \
              (flash-linear-attention's GatedLinearAttention).",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::Signed,
    state: "S = sum over j of Diag(alpha products) k_j v_j^T: H d_k d_v",
    settings: Settings {
        numbers: &[
            real(
                "expand_k",
                0.0625,
                4.0,
                "query/key width per head as a share of the value width (FLA 0.5, MAD 1)",
            ),
            real(
                "gate_rank",
                1.0,
                1024.0,
                "rank of the gate's projection (FLA's gate_low_rank_dim)",
            )
            .whole(),
            real(
                "normaliser",
                1.0,
                1024.0,
                "log-sigmoid of the gate is divided by this (FLA's gate_logit_normalizer)",
            ),
            real(
                "chunk",
                1.0,
                64.0,
                "queries per chunk of the chunked form; within a chunk f32 holds gate \
                 products up to e^(1.25 chunk), so at most 64",
            )
            .whole(),
        ],
        switches: &[Switch {
            key: "gate",
            label: "swish output gate",
            choices: Choices::Toggle,
        }],
    },
    default: || MechanismSpec::Gla(GlaConfig::default()),
};

impl Variant for GlaConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(Gla::new(shape, self, params)?))
    }

    /// The gate's projections, the head norm's gain and the output gate; per token, the
    /// gate's logits and cumulative decay (a key channel each) and the head norm's and gate's
    /// outputs (calibrated against the peaks of tests/memory.rs, where the fused CPU kernel
    /// keeps no chunk scores); on a GPU the composed chunks' scores too, through `keys`.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        let (rank, keys) = (self.gate_rank as f64, layer.heads * layer.qk);
        let width = layer.heads * layer.head_dim;
        let output_gate = if self.gate {
            layer.d_model * width
        } else {
            0.0
        };
        MemoryTerms {
            parameters: (layer.d_model + 1.0) * rank
                + (rank + 1.0) * keys
                + layer.head_dim
                + output_gate,
            keys: layer.len.min(self.chunk as f64),
            features: layer.qk,
            norms: 2.0 * keys + 2.0 * width,
        }
    }

    /// One d_k × d_v matrix per head; zoology counts the same.
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        Some(StateSize::same(layer.heads * layer.qk_dim * layer.head_dim))
    }

    fn qk_dim(&self, head_dim: usize) -> usize {
        ((head_dim as f64 * self.expand_k).round() as usize).max(1)
    }

    /// `gla-k1` for `expand_k` 1 (MAD's), `-nogate` without the output gate.
    fn label(&self) -> String {
        let mut label = FACTS.name.to_string();
        if self.expand_k != GlaConfig::default().expand_k {
            label.push_str(&format!("-k{}", self.expand_k));
        }
        if !self.gate {
            label.push_str("-nogate");
        }
        label
    }
}

#[derive(Clone)]
pub struct Gla {
    scale: f64,
    heads: usize,
    normaliser: f64,
    gated: bool,
    chunk: usize,
    /// W₂ (H·d_k, rank) and its bias, or (R, …) for replicas.
    gate_weight: Tensor,
    gate_bias: Tensor,
    /// b = cumsum log α, (B, H, T, d_k), once bound to an input.
    decay: Option<Tensor>,
}

impl Gla {
    pub fn new(shape: &MechanismShape, config: &GlaConfig, params: &Params) -> Result<Self> {
        let keys = shape.n_heads * shape.qk_dim;
        let gate = params.pp("gate_proj");
        Ok(Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            heads: shape.n_heads,
            normaliser: config.normaliser,
            gated: config.gate,
            chunk: config.chunk.max(1),
            gate_weight: gate.get("weight", (keys, config.gate_rank), Init::Normal(0.02))?,
            gate_bias: gate.get("bias", keys, Init::Constant(0.0))?,
            decay: None,
        })
    }

    /// This layer bound to the low-rank gate code (B, T, rank) of one input: log α =
    /// logsigmoid(W₂ code + b) / normaliser per head and key channel, summed along the
    /// sequence.
    fn bound(&self, code: &Tensor) -> Result<Self> {
        let logits = match self.gate_weight.rank() {
            3 => linear_replicas(code, &self.gate_weight, Some(&self.gate_bias))?,
            _ => linear(code, &self.gate_weight, Some(&self.gate_bias))?,
        };
        let decay = ops::cumulative_log_sigmoid(&logits, self.heads, 1.0 / self.normaliser)?;
        Ok(Self {
            decay: Some(decay),
            ..self.clone()
        })
    }

    /// b for the bound input, or the error that says the layer did not bind one.
    fn decay(&self) -> Result<&Tensor> {
        self.decay
            .as_ref()
            .ok_or_else(|| Error::Internal("GLA was called without its gate inputs".into()))
    }

    /// Σ_c q_ic k_jc exp(b_ic − b_jc) / √d_k for the block's queries (q, rows of b `bq`)
    /// against the keys 0..block.keys() (rows `bk`), 0 above the diagonal: (B, H, len, keys).
    fn gated_scores(&self, q: &Tensor, k: &Tensor, bq: &Tensor, bk: &Tensor) -> Result<Tensor> {
        let diff = bq.unsqueeze(3)?.broadcast_sub(&bk.unsqueeze(2)?)?; // (B, H, len, keys, d_k)
        // Keys after the query have b_j ≤ b_i, so exp could overflow there; they are masked.
        let diff = (&diff - diff.relu()?)?;
        let products = q.unsqueeze(3)?.broadcast_mul(&k.unsqueeze(2)?)?;
        let scores = (products * diff.exp()?)?.sum(D::Minus1)?;
        let visible = causal_mask(&scores)?.exp()?;
        Ok(scores.broadcast_mul(&visible)?.affine(self.scale, 0.0)?)
    }

    /// The explicit matrix for the block's queries, times exp(b) where the encoding has a bias.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
        bias: Option<Tensor>,
    ) -> Result<Attention> {
        let decay = self.decay()?;
        let bq = decay.narrow(2, block.start, block.len)?;
        let bk = decay.narrow(2, 0, block.keys())?;
        let read = |q: &Tensor, k: &Tensor| self.gated_scores(q, k, &bq, &bk);
        Ok(Attention {
            weights: read_scores(q, k, pos, block, bias, &read)?,
            values: v.clone(),
        })
    }

    /// The chunked form, (B, H, T, Dh), equal to the explicit matrix times the values. `None`
    /// when the encoding adds a bias or does not act on q and k alone (ReRoPE).
    fn chunked_output(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
    ) -> Result<Option<Tensor>> {
        let Some((q, k)) = positioned_for_chunks(q, k, pos)? else {
            return Ok(None);
        };
        let decay = self.decay()?;
        let output = channel_decayed_attention(&q, &k, v, decay, (self.scale, self.chunk))?;
        Ok(Some(output))
    }
}

impl Mechanism for Gla {
    super::recurrent::forms!();

    fn output_stage(&self) -> OutputStage {
        OutputStage::HeadNorm { gated: self.gated }
    }

    fn token_inputs(&self) -> usize {
        self.gate_weight.dim(D::Minus1).unwrap_or(0)
    }

    fn with_token_inputs(&self, inputs: &Tensor) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(self.bound(inputs)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::recurrent::testing::{self, shape};
    use super::*;
    use crate::encodings::NoEncoding;
    use crate::ops::testing::random;
    use candle_core::{Device, Var};

    /// The recurrence, token by token, on q and k already positioned:
    /// S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t / √d_k, with α_t = e^(b_t − b_{t−1}).
    fn recurrent_output(gla: &Gla, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let decay = gla.decay().unwrap();
        let (b, h, t, dk) = q.dims4().unwrap();
        let zeros = |dims: (usize, usize, usize, usize)| {
            Tensor::zeros(dims, q.dtype(), q.device()).unwrap()
        };
        let (mut state, mut previous) =
            (zeros((b, h, dk, v.dim(3).unwrap())), zeros((b, h, 1, dk)));
        let mut outputs = Vec::new();
        for i in 0..t {
            let row = |x: &Tensor| x.narrow(2, i, 1).unwrap();
            let bi = row(decay);
            let alpha = (&bi - &previous).unwrap().exp().unwrap();
            let kept = state
                .broadcast_mul(&alpha.transpose(2, 3).unwrap())
                .unwrap();
            state = (kept + row(k).t().unwrap().matmul(&row(v)).unwrap()).unwrap();
            outputs.push((row(q).matmul(&state).unwrap() * gla.scale).unwrap());
            previous = bi;
        }
        Tensor::cat(&outputs, 2).unwrap()
    }

    /// A GLA layer bound to the gate code `code`.
    fn bound(config: &GlaConfig, code: &Tensor) -> Gla {
        let params = Params::new(0, &Device::Cpu);
        let gla = Gla::new(&shape(2), config, &params).unwrap();
        gla.bound(code).unwrap()
    }

    /// At init (W₂ ≈ 0, bias 0) the gate is σ(0)^(1/16) ≈ 0.958 per step and channel.
    #[test]
    fn the_gate_starts_near_0_958() {
        let zeros = Tensor::zeros((1, 3, 16), candle_core::DType::F32, &Device::Cpu).unwrap();
        let mut gla = Gla::new(
            &shape(2),
            &GlaConfig::default(),
            &Params::new(0, &Device::Cpu),
        )
        .unwrap();
        gla.gate_weight = gla.gate_weight.zeros_like().unwrap();
        let gla = gla.bound(&zeros).unwrap();
        let q = Tensor::ones((1, 2, 3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let a = gla.attend(&q, &q, &q, &NoEncoding).unwrap().weights;
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        // Row 1 of head 0: [α·4/√4, 4/√4] with α = 0.5^(1/16).
        let alpha = 0.5f32.powf(1.0 / 16.0);
        assert!(
            (a[3] - 2.0 * alpha).abs() < 1e-5 && (a[4] - 2.0).abs() < 1e-6,
            "{a:?}"
        );
        assert!((alpha - 0.9576).abs() < 1e-4);
    }

    /// The recurrence, the explicit matrix times the values and the chunked form agree in
    /// value and in the gradients of q, k, v and the gate code, at several lengths and chunk
    /// sizes, with and without RoPE.
    #[test]
    fn recurrent_explicit_and_chunked_forms_agree_in_value_and_gradient() {
        let rope = testing::rope();
        for (t, chunk) in [(1, 4), (7, 3), (16, 4), (13, 16), (20, 1)] {
            let config = GlaConfig {
                chunk,
                ..GlaConfig::default()
            };
            let [q, k, v] = testing::heads(t, "gla");
            // Gate logits of about ±40 · 0.02 · 4: gates from about 0.9 to 1.
            let code = Var::from_tensor(&(random(&[2, t, 16], 4, "gla") * 40.0).unwrap()).unwrap();
            let gla = bound(&config, code.as_tensor());
            for pos in [&NoEncoding as &dyn Encoding, rope.as_ref()] {
                let (qr, kr) = pos.positioned(&q, &k).unwrap().unwrap();
                let recurrent = recurrent_output(&gla, &qr, &kr, &v);
                let what = format!("t {t}, chunk {chunk}");
                testing::assert_forms_agree(&gla, pos, &[&q, &k, &v, &code], &recurrent, &what);
            }
        }
    }

    #[test]
    fn a_block_of_queries_gives_the_rows_of_the_whole_matrix() {
        let gla = bound(&GlaConfig::default(), &random(&[1, 9, 16], 8, "gla"));
        testing::assert_blocks_give_rows(&gla, &NoEncoding, "gla");
    }
}
