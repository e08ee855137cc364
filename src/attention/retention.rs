//! RetNet's retention (Sun et al. 2023, arXiv 2307.08621), as flash-linear-attention's
//! `MultiScaleRetention` computes it (`fla/layers/multiscale_retention.py`,
//! `fla/ops/retention/naive.py`). Per head h, with the key scaled by d_k^−½:
//!
//! - recurrent (the truth): S_t = γ_h S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t;
//! - explicit (what the views show): O = A V with A_ij = γ_h^{i−j} q_i·k_j / √d_k for j ≤ i,
//!   a signed matrix whose rows need not sum to 1 ([`Mixing::Signed`]);
//! - chunked (what trains, and evaluates long sequences): chunks of C queries, each the
//!   explicit form within the chunk plus (q_i γ^{i'+1})·S from the state carried over the
//!   earlier chunks, S ← γ^C S + Σ_j γ^{C−1−j'} k_j v_jᵀ (i', j' positions within the chunk;
//!   `fla/ops/simple_gla/naive.py`).
//!
//! The decay is γ_h = 1 − 2^(−5−h), h = 0..H−1 (memories of 32 … 2^(4+H) tokens). Rotary
//! positions come from the encoding slot (FLA uses plain RoPE; torchscale's xPos rotates
//! interleaved pairs, equal up to a fixed permutation of channels when trained from scratch);
//! a bias encoding multiplies the matrix by exp(b), the kernel mechanisms' convention. After
//! A·V the layer takes RMSNorm over each head, times swish(W_g x) when gated
//! ([`OutputStage::HeadNorm`]); the norm is why the matrix is drawn unnormalised (torchscale's
//! row rescalings cancel in it). Values keep the model's head width (FLA's `expand_v` of 2 is
//! not offered).

use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::recurrent::{positioned_for_chunks, read_scores};
use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    OutputStage, StateShape, StateSize, Variant,
};
use crate::Result;
use crate::encodings::{Encoding, LengthCache, QueryBlock};
use crate::ops::{Precision, decayed_attention, dot_scores};
use crate::params::Params;
use crate::settings::{Choices, Settings, Switch, real};

/// Retention's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// The swish output gate swish(W_g x) after the head norm (FLA's default: on).
    pub gate: bool,
    /// Queries per chunk of the chunked form that trains.
    pub chunk: usize,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            gate: true,
            chunk: 64,
        }
    }
}

static FACTS: Facts = Facts {
    name: "retention",
    formula: "A_ij = gamma_h^(i-j) q_i.k_j / sqrt(d_k), j <= i, gamma_h = 1 - 2^(-5-h) (signed); \
              y = RMSNorm_head(A v) * swish(W_g x)",
    summary: "Sun et al. 2023 (RetNet): linear attention with a fixed decay per head, no \
              normaliser; trains chunkwise, runs as a recurrence with an H d_k d_v state \
              (flash-linear-attention's MultiScaleRetention, values at the head width).",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::Signed,
    state: "S = sum gamma^(t-j) k_j v_j^T: H d_k d_v",
    settings: Settings {
        numbers: &[real(
            "chunk",
            1.0,
            65_536.0,
            "queries per chunk of the chunked form that trains; any value gives the same \
             outputs",
        )
        .whole()],
        switches: &[Switch {
            key: "gate",
            label: "swish output gate",
            choices: Choices::Toggle,
        }],
    },
    default: || MechanismSpec::Retention(RetentionConfig::default()),
};

impl Variant for RetentionConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, _params: &Params) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(Retention::new(shape, self)))
    }

    /// The head norm's gain and the gate's projection; per token, the norm's and the gate's
    /// outputs; the chunked form scores each query against the keys of its chunk.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        let width = layer.heads * layer.head_dim;
        let gate = if self.gate {
            layer.d_model * width
        } else {
            0.0
        };
        MemoryTerms {
            parameters: layer.head_dim + gate,
            keys: layer.len.min(self.chunk as f64),
            features: 0.0,
            norms: 3.0 * width,
        }
    }

    /// One d_k × d_v matrix per head; zoology counts the same.
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        Some(StateSize::same(layer.heads * layer.qk_dim * layer.head_dim))
    }

    /// `retention-nogate` without its output gate.
    fn label(&self) -> String {
        match self.gate {
            true => FACTS.name.to_string(),
            false => format!("{}-nogate", FACTS.name),
        }
    }
}

/// The decay of head `h` of any layer: ln γ_h with γ_h = 1 − 2^(−5−h).
pub fn log_decay(h: usize) -> f64 {
    (1.0 - 2f64.powi(-5 - h as i32)).ln()
}

pub struct Retention {
    scale: f64,
    precision: Precision,
    gated: bool,
    chunk: usize,
    /// ln γ_h per head.
    log_decays: Vec<f64>,
    /// exp((i − j) ln γ_h) on and below the diagonal, 0 above, (1, H, T, T) per length.
    decays: LengthCache,
}

impl Retention {
    pub fn new(shape: &MechanismShape, config: &RetentionConfig) -> Self {
        Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            precision: shape.precision,
            gated: config.gate,
            chunk: config.chunk.max(1),
            log_decays: (0..shape.n_heads).map(log_decay).collect(),
            decays: LengthCache::default(),
        }
    }

    /// γ_h^(i−j) for queries `block` against keys 0..block.keys(), 0 for keys after the
    /// query: (1, H, len, keys).
    fn decay(&self, block: QueryBlock, device: &Device) -> Result<Tensor> {
        let build = || -> Result<Tensor> {
            let (len, keys) = (block.len, block.keys());
            let mut data = Vec::with_capacity(self.log_decays.len() * len * keys);
            for &g in &self.log_decays {
                for i in block.start..block.keys() {
                    data.extend((0..keys).map(|j| match i >= j {
                        true => ((i - j) as f64 * g).exp() as f32,
                        false => 0.0,
                    }));
                }
            }
            Ok(Tensor::from_vec(
                data,
                (1, self.log_decays.len(), len, keys),
                device,
            )?)
        };
        match block == QueryBlock::whole(block.total) {
            true => self.decays.get_or(block.total, build),
            false => build(),
        }
    }

    /// The explicit matrix for the block's queries: (q·k/√d_k after the encoding) ⊙ γ^(i−j),
    /// times exp(b) where the encoding has a bias.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
        bias: Option<Tensor>,
    ) -> Result<Attention> {
        let decay = self.decay(block, q.device())?;
        let read = |q: &Tensor, k: &Tensor| -> Result<Tensor> {
            let scores = (self.precision).product(q, k, |q, k| dot_scores(q, k, self.scale))?;
            Ok(scores.broadcast_mul(&decay)?)
        };
        Ok(Attention {
            weights: read_scores(q, k, pos, block, bias, &read)?,
            values: v.clone(),
        })
    }

    /// G_i = i ln γ_h, the cumulative log-decay of each head over `t` positions: (1, H, t, 1).
    fn cumulative_decay(&self, t: usize, device: &Device) -> Result<Tensor> {
        let data = self
            .log_decays
            .iter()
            .flat_map(|&g| (0..t).map(move |i| (i as f64 * g) as f32))
            .collect();
        Ok(Tensor::from_vec(
            data,
            (1, self.log_decays.len(), t, 1),
            device,
        )?)
    }

    /// The chunked form, (B, H, T, Dh), equal to the explicit matrix times the values, never
    /// holding more than chunk × chunk weights per head ([`decayed_attention`]). `None` when
    /// the encoding adds a bias or does not act on q and k alone (ReRoPE): those take the
    /// explicit form.
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
        let g = self.cumulative_decay(q.dim(2)?, q.device())?;
        Ok(Some(decayed_attention(
            &q,
            &k,
            v,
            &g,
            (self.scale, self.chunk),
        )?))
    }
}

impl Mechanism for Retention {
    super::recurrent::forms!();

    fn output_stage(&self) -> OutputStage {
        OutputStage::HeadNorm { gated: self.gated }
    }
}

#[cfg(test)]
mod tests {
    use super::super::recurrent::testing::{self, shape};
    use super::*;
    use crate::encodings::NoEncoding;

    /// The recurrence, token by token: S_t = γ S_{t−1} + (k_t/√d_k) v_tᵀ, o_t = S_tᵀ q_t,
    /// on q and k already rotated.
    fn recurrent_output(att: &Retention, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (b, h, t, dk) = q.dims4().unwrap();
        let dv = v.dim(3).unwrap();
        let gammas: Vec<f32> = att.log_decays.iter().map(|g| g.exp() as f32).collect();
        let gamma = Tensor::from_vec(gammas, (1, h, 1, 1), q.device()).unwrap();
        let mut state = Tensor::zeros((b, h, dk, dv), q.dtype(), q.device()).unwrap();
        let mut outputs = Vec::new();
        for i in 0..t {
            let row = |x: &Tensor| x.narrow(2, i, 1).unwrap();
            let (qi, ki, vi) = (row(q), (row(k) * att.scale).unwrap(), row(v));
            state = (state.broadcast_mul(&gamma).unwrap() + ki.t().unwrap().matmul(&vi).unwrap())
                .unwrap();
            outputs.push(qi.matmul(&state).unwrap());
        }
        Tensor::cat(&outputs, 2).unwrap()
    }

    /// A head's decay is 1 − 2^(−5−h): 0.96875 for the first, 0.984375 for the second.
    #[test]
    fn the_decay_of_head_h_is_one_minus_two_to_the_minus_five_minus_h() {
        assert!((log_decay(0).exp() - 0.96875).abs() < 1e-12);
        assert!((log_decay(1).exp() - 0.984375).abs() < 1e-12);
        assert!((log_decay(7).exp() - (1.0 - 1.0 / 4096.0)).abs() < 1e-12);
    }

    /// One head, one channel: A_ij = γ^(i−j) q_i k_j / √1, zero above the diagonal.
    #[test]
    fn the_matrix_is_the_decayed_product_of_queries_and_keys() {
        let shape = MechanismShape {
            qk_dim: 1,
            head_dim: 1,
            ..shape(1)
        };
        let att = Retention::new(&shape, &RetentionConfig::default());
        let q = Tensor::new(&[[[[2f32], [-1.0]]]], &Device::Cpu).unwrap();
        let k = Tensor::new(&[[[[3f32], [0.5]]]], &Device::Cpu).unwrap();
        let a = att.attend(&q, &k, &q, &NoEncoding).unwrap();
        let w = a.weights.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let g = 0.96875f32;
        let expected = [6.0, 0.0, -3.0 * g, -0.5];
        for (w, e) in w.iter().zip(expected) {
            assert!((w - e).abs() < 1e-6, "{w:?} against {expected:?}");
        }
    }

    /// The recurrence, the explicit matrix times the values and the chunked form agree, at
    /// several lengths and chunk sizes, with and without RoPE; so do their gradients.
    #[test]
    fn recurrent_explicit_and_chunked_forms_agree_in_value_and_gradient() {
        let rope = testing::rope();
        for (t, chunk) in [(1, 4), (7, 3), (16, 4), (13, 16), (20, 1)] {
            let config = RetentionConfig {
                chunk,
                ..RetentionConfig::default()
            };
            let att = Retention::new(&shape(2), &config);
            let [q, k, v] = testing::heads(t, "retention");
            for pos in [&NoEncoding as &dyn Encoding, rope.as_ref()] {
                let (qr, kr) = pos.positioned(&q, &k).unwrap().unwrap();
                let recurrent = recurrent_output(&att, &qr, &kr, &v);
                let what = format!("t {t}, chunk {chunk}");
                testing::assert_forms_agree(&att, pos, &[&q, &k, &v], &recurrent, &what);
            }
        }
    }

    #[test]
    fn a_block_of_queries_gives_the_rows_of_the_whole_matrix() {
        let att = Retention::new(&shape(2), &RetentionConfig::default());
        testing::assert_blocks_give_rows(&att, &NoEncoding, "retention");
    }
}
