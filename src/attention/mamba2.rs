//! Mamba-2's SSD layer (Dao & Gu 2024, arXiv 2405.21060) with a scalar-identity A per head, as
//! `mamba_ssm/modules/mamba2.py` and `ssd_minimal.py` compute it, in attention's terms: C is the
//! query, B the key and x the value of each head (`ngroups` = heads: every head its own B and
//! C), all three after the layer's short convolution and silu ([`Mechanism::input_conv`]). Per
//! head, with dt_t = softplus(w_dtᵀ x_t + dt_bias) and A = −exp(A_log):
//!
//! - recurrent (the truth): h_t = e^{dt_t A} h_{t−1} + dt_t B_t x_tᵀ, y_t = h_tᵀ C_t + D x_t;
//! - explicit (the views): A_ij = (C_i·B_j) e^{cs_i − cs_j} dt_j for j < i, plus D on the
//!   diagonal (so that y = A x exactly, the skip included), cs = cumsum(dt·A): signed;
//! - chunked (training): within a chunk that matrix, across chunks the carried state, as
//!   `ssd_minimal_discrete`.
//!
//! Then RMSNorm over each head of y ⊙ silu(z), z = W_z x ([`OutputStage::GatedHeadNorm`],
//! `norm_before_gate = False`). attnlab's sizes: d_state = the per-head width of B and C, the
//! heads' width P = the model's head width (Mamba-2's `expand` of 2 and `headdim` 64 are not
//! offered), conv without its bias.

use std::sync::Arc;

use candle_core::{D, Tensor};
use serde::{Deserialize, Serialize};

use super::recurrent::{Decay, per_head, positioned_for_chunks, read_scores};
use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    OutputStage, StateShape, StateSize, Variant,
};
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::{decay_matrix, decayed_attention};
use crate::params::{Init, Params};
use crate::settings::{Settings, real};
use crate::{Error, Result};

/// Mamba-2's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Mamba2Config {
    /// N: the state's width per head, the width of B and C (zoology's recall runs: 8–24).
    pub d_state: usize,
    /// Kernel of the short convolution over x, B and C (0: none).
    pub conv: usize,
    /// Queries per chunk of the chunked form that trains.
    pub chunk: usize,
}

impl Default for Mamba2Config {
    fn default() -> Self {
        Self {
            d_state: 16,
            conv: 4,
            chunk: 16,
        }
    }
}

static FACTS: Facts = Facts {
    name: "mamba2",
    formula: "h_t = e^(dt_t A) h_t-1 + dt_t B_t x_t^T, y_t = h_t^T C_t + D x_t; A_ij = (C_i.B_j) \
              e^(cs_i - cs_j) dt_j + D [i = j], cs = cumsum(dt A) (signed); out = \
              RMSNorm_head(y * silu(z))",
    summary: "Dao & Gu 2024: the SSD layer, a selective state space with a scalar decay per \
              head, as masked attention with C, B, x for q, k, v (mamba_ssm's Mamba2 with \
              ngroups = heads, at the model's head width).",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::Signed,
    state: "h: H N P (plus the convolution's last k - 1 inputs); zoology: 2 d N",
    settings: Settings::of(&[
        real(
            "d_state",
            1.0,
            256.0,
            "N, the state's width per head: the width of B and C (Mamba-2: 128; zoology's \
             recall runs: 8-24)",
        )
        .whole(),
        real(
            "conv",
            0.0,
            16.0,
            "kernel of the short convolution over x, B and C, each then through silu \
             (Mamba-2: 4; 0 = none)",
        )
        .whole(),
        real(
            "chunk",
            1.0,
            256.0,
            "queries per chunk of the chunked form that trains; any value gives the same \
             outputs",
        )
        .whole(),
    ]),
    default: || MechanismSpec::Mamba2(Mamba2Config::default()),
};

impl Variant for Mamba2Config {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(Mamba2::new(shape, self, params)?))
    }

    /// dt's projection, A_log, dt_bias, D, the convolutions, the norm's gain and z's
    /// projection; per chunk its C × C scores and decays (calibrated against the peaks of
    /// tests/memory.rs).
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        let channels = layer.heads * (2.0 * layer.qk + layer.head_dim);
        let width = layer.heads * layer.head_dim;
        let c = layer.len.min(self.chunk as f64);
        MemoryTerms {
            parameters: (layer.d_model + 1.0) * layer.heads
                + 3.0 * layer.heads
                + self.conv as f64 * channels
                + layer.head_dim
                + layer.d_model * width,
            keys: 3.0 * c,
            features: layer.qk,
            norms: 3.0 * channels + 4.0 * width,
        }
    }

    /// h, and the inputs the convolution keeps; zoology counts 2 d N (its expand of 2).
    fn state(&self, layer: &StateShape) -> Option<StateSize> {
        let channels = layer.heads * (2 * layer.qk_dim + layer.head_dim);
        Some(StateSize {
            floats: layer.heads * layer.qk_dim * layer.head_dim
                + self.conv.saturating_sub(1) * channels,
            zoology: 2 * layer.heads * layer.head_dim * layer.qk_dim,
        })
    }

    fn qk_dim(&self, _head_dim: usize) -> usize {
        self.d_state
    }

    /// `mamba2-n<N>`, the state width being what a sweep varies.
    fn label(&self) -> String {
        format!("{}-n{}", FACTS.name, self.d_state)
    }
}

/// What one input binds: dt and cs = cumsum(dt·A), each (B, H, T, 1).
#[derive(Clone)]
struct Bound {
    dt: Tensor,
    cs: Tensor,
}

#[derive(Clone)]
pub struct Mamba2 {
    conv: usize,
    chunk: usize,
    decay: Decay,
    /// The skip D per head, (H) or (R, H).
    skip: Tensor,
    bound: Option<Bound>,
}

impl Mamba2 {
    fn new(shape: &MechanismShape, config: &Mamba2Config, params: &Params) -> Result<Self> {
        Ok(Self {
            conv: config.conv,
            chunk: config.chunk.max(1),
            // A ~ U(1, 16) (mamba2.py's A_init_range).
            decay: Decay::new(shape.n_heads, (1.0, 16.0), params)?,
            skip: params.get("D", shape.n_heads, Init::Constant(1.0))?,
            bound: None,
        })
    }

    /// This layer bound to dt's raw inputs (B, T, H) of one input.
    fn bind(&self, raw: &Tensor) -> Result<Self> {
        let (dt, g) = self.decay.of(raw)?;
        Ok(Self {
            bound: Some(Bound {
                dt,
                cs: g.cumsum(2)?,
            }),
            ..self.clone()
        })
    }

    fn bound(&self) -> Result<&Bound> {
        self.bound
            .as_ref()
            .ok_or_else(|| Error::Internal("Mamba-2 was called without its dt inputs".into()))
    }

    /// D on the diagonal of the block's queries (the last `len` of `keys` positions), per
    /// head: (B, H, len, keys).
    fn skip_diagonal(&self, batch: usize, len: usize, keys: usize) -> Result<Tensor> {
        let eye = Tensor::eye(len, self.skip.dtype(), self.skip.device())?;
        let eye = match keys - len {
            0 => eye,
            before => {
                let zeros = Tensor::zeros((len, before), eye.dtype(), eye.device())?;
                Tensor::cat(&[&zeros, &eye], 1)?
            }
        };
        Ok(eye.broadcast_mul(&per_head(&self.skip, batch)?)?)
    }

    /// The explicit matrix for the block's queries (C) over keys (B) 0..block.keys(): the
    /// decayed scores times dt of each key, times exp(b) where the encoding has a bias, plus
    /// D on the diagonal.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
        bias: Option<Tensor>,
    ) -> Result<Attention> {
        let Bound { dt, cs } = self.bound()?;
        let keys = block.keys();
        let (cq, ck) = (
            cs.narrow(2, block.start, block.len)?,
            cs.narrow(2, 0, keys)?,
        );
        let dt = dt.narrow(2, 0, keys)?.transpose(2, 3)?; // (B, H, 1, keys)
        let read = |q: &Tensor, k: &Tensor| -> Result<Tensor> {
            let scores = q.matmul(&k.t()?)?.mul(&decay_matrix(&cq, &ck)?)?;
            Ok(scores.broadcast_mul(&dt)?)
        };
        let weights = read_scores(q, k, pos, block, bias, &read)?;
        let skip = self.skip_diagonal(q.dim(0)?, block.len, keys)?;
        Ok(Attention {
            weights: weights.broadcast_add(&skip)?,
            values: v.clone(),
        })
    }

    /// The chunked form, (B, H, T, P). `None` when the encoding adds a bias or does not act on
    /// q and k alone (ReRoPE): those take the explicit form.
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
        let Bound { dt, cs } = self.bound()?;
        let k = k.broadcast_mul(dt)?; // dt_j B_j
        let output = decayed_attention(&q, &k, v, cs, (1.0, self.chunk))?;
        let skip = v.broadcast_mul(&per_head(&self.skip, v.dim(0)?)?)?;
        Ok(Some((output + skip)?))
    }
}

impl Mechanism for Mamba2 {
    super::recurrent::forms!();

    fn output_stage(&self) -> OutputStage {
        OutputStage::GatedHeadNorm
    }

    fn input_conv(&self) -> Option<usize> {
        (self.conv > 0).then_some(self.conv)
    }

    /// dt's raw input per head.
    fn token_inputs(&self) -> usize {
        self.skip.dim(D::Minus1).unwrap_or(0)
    }

    fn with_token_inputs(&self, inputs: &Tensor) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(self.bind(inputs)?))
    }
}

#[cfg(test)]
mod tests {
    use super::super::recurrent::testing::{self, shape};
    use super::*;
    use crate::encodings::NoEncoding;
    use crate::ops::testing::random;
    use candle_core::{Device, Var};

    fn layer(chunk: usize, raw: &Tensor) -> Mamba2 {
        let config = Mamba2Config {
            chunk,
            d_state: 4,
            ..Mamba2Config::default()
        };
        let mamba = Mamba2::new(&shape(2), &config, &Params::new(0, &Device::Cpu)).unwrap();
        mamba.bind(raw).unwrap()
    }

    /// The recurrence, token by token, on C and B already positioned:
    /// h_t = e^{dt_t A} h_{t−1} + dt_t B_t x_tᵀ, y_t = h_tᵀ C_t + D x_t.
    fn recurrent_output(mamba: &Mamba2, c: &Tensor, b: &Tensor, x: &Tensor) -> Tensor {
        let Bound { dt, cs } = mamba.bound().unwrap();
        let (batch, h, t, n) = c.dims4().unwrap();
        let dims = (batch, h, n, x.dim(3).unwrap());
        let mut state = Tensor::zeros(dims, c.dtype(), c.device()).unwrap();
        let skip = per_head(&mamba.skip, batch).unwrap();
        let mut previous = cs.narrow(2, 0, 1).unwrap().zeros_like().unwrap();
        let mut outputs = Vec::new();
        for i in 0..t {
            let row = |z: &Tensor| z.narrow(2, i, 1).unwrap();
            let decay = (row(cs) - &previous).unwrap().exp().unwrap();
            let written = row(b).t().unwrap().matmul(&row(x)).unwrap();
            let written = written.broadcast_mul(&row(dt)).unwrap();
            state = (state.broadcast_mul(&decay).unwrap() + written).unwrap();
            let read = row(c).matmul(&state).unwrap();
            outputs.push((read + row(x).broadcast_mul(&skip).unwrap()).unwrap());
            previous = row(cs);
        }
        Tensor::cat(&outputs, 2).unwrap()
    }

    /// At init dt = softplus(dt_bias) lies in [1e-3, 0.1] and A in [−16, 0): every step's
    /// decay e^{dt A} is in (0.2, 1).
    #[test]
    fn the_initial_decay_per_step_is_between_0_2_and_1() {
        let mamba = layer(
            16,
            &Tensor::zeros((1, 5, 2), candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
        let Bound { dt, cs } = mamba.bound().unwrap();
        let dt = dt.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(
            dt.iter().all(|&d| (0.999e-3..=0.1001).contains(&d)),
            "{dt:?}"
        );
        let step = cs.narrow(2, 0, 1).unwrap().exp().unwrap();
        let step = step.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(step.iter().all(|&s| (0.2..1.0).contains(&s)), "{step:?}");
    }

    /// The recurrence, the explicit matrix times the values and the chunked form agree in
    /// value and in the gradients of C, B, x and dt's inputs, at several lengths and chunk
    /// sizes, with and without RoPE.
    #[test]
    fn recurrent_explicit_and_chunked_forms_agree_in_value_and_gradient() {
        let rope = testing::rope();
        for (t, chunk) in [(1, 4), (7, 3), (16, 4), (13, 16), (9, 1)] {
            let [c, b, x] = testing::heads(t, "mamba2");
            // Raw dt inputs of about ±4: dt from about 0.02 to 4, decays from 0 to 1.
            let raw = Var::from_tensor(&(random(&[2, t, 2], 4, "mamba2") * 4.0).unwrap()).unwrap();
            let mamba = layer(chunk, raw.as_tensor());
            for pos in [&NoEncoding as &dyn Encoding, rope.as_ref()] {
                let (cr, br) = pos.positioned(&c, &b).unwrap().unwrap();
                let recurrent = recurrent_output(&mamba, &cr, &br, &x);
                let what = format!("t {t}, chunk {chunk}");
                testing::assert_forms_agree(&mamba, pos, &[&c, &b, &x, &raw], &recurrent, &what);
            }
        }
    }

    #[test]
    fn a_block_of_queries_gives_the_rows_of_the_whole_matrix() {
        let mamba = layer(16, &random(&[1, 9, 2], 8, "mamba2"));
        testing::assert_blocks_give_rows(&mamba, &NoEncoding, "mamba2");
    }
}
