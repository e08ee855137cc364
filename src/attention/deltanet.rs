//! DeltaNet (Schlag et al. 2021; Yang et al. 2024, arXiv 2406.06484) and Gated DeltaNet (Yang
//! et al. 2024, arXiv 2412.06464), as flash-linear-attention computes them
//! (`fla/layers/delta_net.py`, `fla/ops/delta_rule/naive.py`, `fla/layers/gated_deltanet.py`,
//! `fla/ops/gated_delta_rule/naive.py`). Per head, with q and k L2-normalised after the layer's
//! short convolution and silu ([`Mechanism::input_conv`]), q scaled by d_k^−½, and from the
//! layer's input β_t = sigmoid(w_βᵀ x_t) and, gated, g_t = −exp(A_log)·softplus(w_aᵀ x_t + dt_bias):
//!
//! - recurrent (the truth): S_t = e^{g_t} (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,
//!   o_t = S_tᵀ q_t (g = 0 without the gate: the delta rule);
//! - explicit (the views): A = (Q Kᵀ ⊙ Γ ⊙ M) (I + tril(diag(β)(K Kᵀ ⊙ Γ), −1))⁻¹ diag(β),
//!   Γ_ij = e^{γ_i − γ_j} with γ = cumsum g, M lower-triangular with its diagonal: signed (the
//!   negative entries are the rule's erasures). The inverse is [`crate::ops::unit_lower_inverse`]
//!   (candle has no triangular solve): fused on the CPU, by blocks elsewhere;
//! - chunked (training, long evaluation): per chunk, X = that inverse of the chunk's keys,
//!   W = X (K ⊙ e^γ), U = X V, R = U − W S; O = (Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ ⊙ M) R and
//!   S ← e^{γ_C} S + (K ⊙ e^{γ_C − γ})ᵀ R, γ counted from the chunk's start
//!   ([`delta_rule_composed`]); on the CPU in f32 the fused [`delta_rule`] runs the recurrence
//!   instead, with fewer flops at these widths, tested against the chunks.
//!
//! Then RMSNorm over each head ([`OutputStage::HeadNorm`]), times swish(W_g x) where gated (on
//! by default for Gated DeltaNet, off for DeltaNet, as FLA's layers). Values keep the model's
//! head width (Gated DeltaNet's `expand_v` of 2 is not offered). An encoding in the slot: a
//! rotary one rotates the normalised q and k everywhere; a bias multiplies the read scores
//! Q Kᵀ by exp(b), not the keys' overlaps inside the inverse (attnlab's choice).

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::recurrent::{Decay, heads_first, positioned_for_chunks, read_scores};
use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    OutputStage, StateShape, StateSize, Variant,
};
use crate::encodings::{Encoding, QueryBlock};
#[cfg(doc)]
use crate::ops::delta_rule_composed;
use crate::ops::{self, RowNorm, decay_matrix, delta_inverse, delta_rule};
use crate::params::Params;
use crate::settings::{Choices, Hyperparameter, Settings, Switch, real};
use crate::{Error, Result};

/// DeltaNet's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeltaNetConfig {
    /// Kernel of the short convolution over q, k and v (0: none).
    pub conv: usize,
    /// The swish output gate after the head norm (FLA's DeltaNet: off).
    pub gate: bool,
    /// Queries per chunk of the chunked form (FLA's 64: at d 128 on 2 CPU cores a step of the
    /// composed chunks, then a loop over chunks with the inverse by rows, took 124 ms at T 64
    /// and 4.1 s at T 1024, against 150 ms and 6.8 s with chunks of 16); on the CPU the fused
    /// op's backward pass takes the chunks, its forward pass the recurrence.
    pub chunk: usize,
}

impl Default for DeltaNetConfig {
    fn default() -> Self {
        Self {
            conv: 4,
            gate: false,
            chunk: 64,
        }
    }
}

/// Gated DeltaNet's settings: DeltaNet's, with the output gate on by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatedDeltaNetConfig {
    /// Kernel of the short convolution over q, k and v (0: none).
    pub conv: usize,
    /// The swish output gate after the head norm (FLA's Gated DeltaNet: on).
    pub gate: bool,
    /// Queries per chunk of the chunked form that trains (FLA's 64, as DeltaNet's).
    pub chunk: usize,
}

impl Default for GatedDeltaNetConfig {
    fn default() -> Self {
        Self {
            conv: 4,
            gate: true,
            chunk: 64,
        }
    }
}

const NUMBERS: &[Hyperparameter] = &[
    real(
        "conv",
        0.0,
        16.0,
        "kernel of the short convolution over q, k and v before the rule, each then through \
         silu (FLA: 4; 0 = none)",
    )
    .whole(),
    real(
        "chunk",
        1.0,
        256.0,
        "queries per chunk of the chunked form that trains; any value gives the same outputs",
    )
    .whole(),
];

const SWITCHES: &[Switch] = &[Switch {
    key: "gate",
    label: "swish output gate",
    choices: Choices::Toggle,
}];

static DELTANET_FACTS: Facts = Facts {
    name: "deltanet",
    formula: "S_t = (I - beta_t k_t k_t^T) S_t-1 + beta_t k_t v_t^T; A = (Q K^T * M) (I + \
              tril(diag(beta) K K^T, -1))^-1 diag(beta) (signed); y = RMSNorm_head(A v)",
    summary: "Schlag et al. 2021, Yang et al. 2024: the delta rule, which overwrites what a key \
              stored instead of adding to it; L2-normalised q, k after a short convolution, \
              beta = sigmoid(w x); H d_k d_v state (flash-linear-attention's DeltaNet).",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::Signed,
    state: "S: H d_k d_v (plus the convolutions' last k - 1 inputs)",
    settings: Settings {
        numbers: NUMBERS,
        switches: SWITCHES,
    },
    default: || MechanismSpec::Deltanet(DeltaNetConfig::default()),
};

static GATED_FACTS: Facts = Facts {
    name: "gated-deltanet",
    formula: "S_t = e^g_t (I - beta_t k_t k_t^T) S_t-1 + beta_t k_t v_t^T, g = -exp(A_log) \
              softplus(w x + dt_bias); A = (Q K^T * G * M)(I + tril(diag(beta)(K K^T * G), \
              -1))^-1 diag(beta) (signed); y = RMSNorm_head(A v) * swish(W_g x)",
    summary: "Yang et al. 2024: the delta rule with Mamba-2's decay gate per head; \
              flash-linear-attention's GatedDeltaNet at the model's head width.",
    causal: true,
    keys_have_positions: true,
    mixing: Mixing::Signed,
    state: "S: H d_k d_v (plus the convolutions' last k - 1 inputs)",
    settings: Settings {
        numbers: NUMBERS,
        switches: SWITCHES,
    },
    default: || MechanismSpec::GatedDeltanet(GatedDeltaNetConfig::default()),
};

/// What the two configs share, as one layer is built from it.
#[derive(Clone, Copy, Debug)]
struct Rule {
    decay_gate: bool,
    conv: usize,
    gate: bool,
    chunk: usize,
}

impl Rule {
    fn memory(self, layer: &LayerSize) -> MemoryTerms {
        let inputs = layer.heads * if self.decay_gate { 2.0 } else { 1.0 };
        let channels = layer.heads * (2.0 * layer.qk + layer.head_dim);
        let width = layer.heads * layer.head_dim;
        let output_gate = if self.gate {
            layer.d_model * width
        } else {
            0.0
        };
        let decay = if self.decay_gate {
            2.0 * layer.heads
        } else {
            0.0
        };
        MemoryTerms {
            parameters: (layer.d_model + 1.0) * inputs
                + self.conv as f64 * channels
                + decay
                + layer.head_dim
                + output_gate,
            // The composed chunks (a GPU): per chunk of C a dozen C × C products,
            // masks and the keys' inverse, kept for the backward pass: counted as keys per
            // query, 3 floats each (calibrated against the peaks of tests/memory.rs when the
            // CPU ran them). The fused recurrence on the CPU keeps none of it.
            keys: {
                let c = layer.len.min(self.chunk as f64);
                4.0 * c
            },
            features: layer.qk,
            // The projections the convolutions read, and the head norm's output: the fused
            // convolution, L2 norms and head norm keep no intermediates (tests/memory.rs).
            norms: channels + width,
        }
    }

    /// S, and the inputs the convolutions keep.
    fn state(self, layer: &StateShape) -> StateSize {
        let matrix = layer.heads * layer.qk_dim * layer.head_dim;
        let channels = layer.heads * (2 * layer.qk_dim + layer.head_dim);
        StateSize {
            floats: matrix + self.conv.saturating_sub(1) * channels,
            zoology: matrix,
        }
    }

    fn label(self, name: &str, default_gate: bool) -> String {
        let mut label = name.to_string();
        if self.gate != default_gate {
            label.push_str(if self.gate { "-gate" } else { "-nogate" });
        }
        if self.conv != 4 {
            label.push_str(&format!("-conv{}", self.conv));
        }
        label
    }
}

impl DeltaNetConfig {
    fn settings(&self) -> Rule {
        Rule {
            decay_gate: false,
            conv: self.conv,
            gate: self.gate,
            chunk: self.chunk,
        }
    }
}

impl GatedDeltaNetConfig {
    fn settings(&self) -> Rule {
        Rule {
            decay_gate: true,
            conv: self.conv,
            gate: self.gate,
            chunk: self.chunk,
        }
    }
}

/// The [`Variant`] of each config, through the settings they share.
macro_rules! delta_variant {
    ($config:ty, $facts:expr) => {
        impl Variant for $config {
            const FACTS: &'static Facts = $facts;

            fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
                Ok(Arc::new(DeltaNet::new(shape, self.settings(), params)?))
            }

            fn memory(&self, layer: &LayerSize) -> MemoryTerms {
                self.settings().memory(layer)
            }

            fn state(&self, layer: &StateShape) -> Option<StateSize> {
                Some(self.settings().state(layer))
            }

            fn label(&self) -> String {
                self.settings()
                    .label($facts.name, <$config>::default().gate)
            }
        }
    };
}

delta_variant!(DeltaNetConfig, &DELTANET_FACTS);
delta_variant!(GatedDeltaNetConfig, &GATED_FACTS);

/// x / ‖x‖ over the last dimension (FLA's l2norm, eps 1e-6).
fn l2_normalised(x: &Tensor) -> Result<Tensor> {
    ops::normalise(x, RowNorm::L2, 1e-6)
}

/// What one input binds: β and, gated, the log-decay g of each step, each (B, H, T, 1).
#[derive(Clone)]
struct Bound {
    beta: Tensor,
    g: Option<Tensor>,
}

#[derive(Clone)]
pub struct DeltaNet {
    scale: f64,
    heads: usize,
    settings: Rule,
    /// The decay gate, gated only.
    decay: Option<Decay>,
    bound: Option<Bound>,
}

impl DeltaNet {
    fn new(shape: &MechanismShape, settings: Rule, params: &Params) -> Result<Self> {
        let decay = settings
            .decay_gate
            .then(|| Decay::new(shape.n_heads, (0.0, 16.0), params))
            .transpose()?;
        Ok(Self {
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            heads: shape.n_heads,
            settings,
            decay,
            bound: None,
        })
    }

    /// This layer bound to the per-token inputs (B, T, H or 2H) of one input.
    fn bind(&self, inputs: &Tensor) -> Result<Self> {
        let h = self.heads;
        let beta = heads_first(&candle_nn::ops::sigmoid(&inputs.narrow(2, 0, h)?)?)?;
        let g = match &self.decay {
            Some(decay) => Some(decay.of(&inputs.narrow(2, h, h)?)?.1),
            None => None,
        };
        Ok(Self {
            bound: Some(Bound { beta, g }),
            ..self.clone()
        })
    }

    fn bound(&self) -> Result<&Bound> {
        self.bound
            .as_ref()
            .ok_or_else(|| Error::Internal("DeltaNet was called without its β inputs".into()))
    }

    /// g, each step's log-decay (zeros without the decay gate).
    fn steps(&self) -> Result<Tensor> {
        let bound = self.bound()?;
        Ok(match &bound.g {
            Some(g) => g.clone(),
            None => bound.beta.zeros_like()?,
        })
    }

    /// γ = cumsum g, rows `start..start + len`.
    fn gamma(&self, start: usize, len: usize) -> Result<Tensor> {
        Ok(self.steps()?.cumsum(2)?.narrow(2, start, len)?)
    }

    /// The explicit matrix for the block's queries over keys 0..block.keys().
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
        bias: Option<Tensor>,
    ) -> Result<Attention> {
        let keys = block.keys();
        let (q, k) = (l2_normalised(q)?, l2_normalised(k)?);
        let (gq, gk) = (self.gamma(block.start, block.len)?, self.gamma(0, keys)?);
        let beta = self.bound()?.beta.narrow(2, 0, keys)?;
        // The keys' overlaps inside the inverse take the rotated keys where the encoding
        // rotates them, the raw ones otherwise (ReRoPE).
        let rotated = pos.positioned(&k, &k)?.map(|(_, k)| k);
        let x = delta_inverse(
            rotated.as_ref().unwrap_or(&k),
            &beta,
            &decay_matrix(&gk, &gk)?,
        )?;
        let read = |q: &Tensor, k: &Tensor| -> Result<Tensor> {
            let scores = (q.matmul(&k.t()?)? * self.scale)?;
            Ok(scores.mul(&decay_matrix(&gq, &gk)?)?)
        };
        let scores = read_scores(&q, &k, pos, block, bias, &read)?;
        Ok(Attention {
            weights: scores.matmul(&x)?,
            values: v.clone(),
        })
    }

    /// The chunked form, (B, H, T, Dh). `None` when the encoding adds a bias or does not act on
    /// q and k alone (ReRoPE): those take the explicit form.
    fn chunked_output(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
    ) -> Result<Option<Tensor>> {
        let (q, k) = (l2_normalised(q)?, l2_normalised(k)?);
        let Some((q, k)) = positioned_for_chunks(&q, &k, pos)? else {
            return Ok(None);
        };
        let beta = &self.bound()?.beta;
        let spans = (self.scale, self.settings.chunk);
        Ok(Some(delta_rule(&q, &k, v, (&self.steps()?, beta), spans)?))
    }
}

impl Mechanism for DeltaNet {
    super::recurrent::forms!();

    fn output_stage(&self) -> OutputStage {
        OutputStage::HeadNorm {
            gated: self.settings.gate,
        }
    }

    fn input_conv(&self) -> Option<usize> {
        (self.settings.conv > 0).then_some(self.settings.conv)
    }

    /// β per head, and the decay gate's input per head where gated.
    fn token_inputs(&self) -> usize {
        self.heads * if self.settings.decay_gate { 2 } else { 1 }
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

    fn layer(gated: bool, chunk: usize, inputs: &Tensor) -> DeltaNet {
        let settings = Rule {
            decay_gate: gated,
            conv: 4,
            gate: gated,
            chunk,
        };
        let net = DeltaNet::new(&shape(2), settings, &Params::new(0, &Device::Cpu)).unwrap();
        net.bind(inputs).unwrap()
    }

    /// The recurrence, token by token, on q and k normalised and positioned:
    /// S_t = e^{g_t}(S_{t−1} − β_t k_t (k_tᵀ S_{t−1})) + β_t k_t v_tᵀ, o_t = S_tᵀ q_t / √d_k.
    fn recurrent_output(net: &DeltaNet, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (b, h, t, dk) = q.dims4().unwrap();
        let beta = &net.bound().unwrap().beta;
        let mut state =
            Tensor::zeros((b, h, dk, v.dim(3).unwrap()), q.dtype(), q.device()).unwrap();
        let mut previous = net.gamma(0, 1).unwrap().zeros_like().unwrap();
        let mut outputs = Vec::new();
        for i in 0..t {
            let row = |x: &Tensor| x.narrow(2, i, 1).unwrap();
            let (ki, bi, gi) = (row(k), row(beta), net.gamma(i, 1).unwrap());
            let decay = (&gi - &previous).unwrap().exp().unwrap();
            let erased = ki.t().unwrap().matmul(&ki.matmul(&state).unwrap()).unwrap();
            let erased = (&state - erased.broadcast_mul(&bi).unwrap()).unwrap();
            let written = ki
                .t()
                .unwrap()
                .matmul(&row(v))
                .unwrap()
                .broadcast_mul(&bi)
                .unwrap();
            state = (erased.broadcast_mul(&decay).unwrap() + written).unwrap();
            outputs.push((row(q).matmul(&state).unwrap() * net.scale).unwrap());
            previous = gi;
        }
        Tensor::cat(&outputs, 2).unwrap()
    }

    /// One head, one key channel, β = 1: the second key overwrites what the first stored under
    /// the same key, so a query on that key reads only v₂ (A = [0, 1]), as the delta rule says.
    #[test]
    fn the_delta_rule_overwrites_a_key() {
        let settings = Rule {
            decay_gate: false,
            conv: 0,
            gate: false,
            chunk: 64,
        };
        let one_head = MechanismShape {
            n_heads: 1,
            qk_dim: 1,
            head_dim: 1,
            ..shape(2)
        };
        let net = DeltaNet::new(&one_head, settings, &Params::new(0, &Device::Cpu)).unwrap();
        let certain = Tensor::new(&[[[40f32], [40.0]]], &Device::Cpu).unwrap(); // β ≈ 1
        let net = net.bind(&certain).unwrap();
        let k = Tensor::new(&[[[[1f32], [1.0]]]], &Device::Cpu).unwrap();
        let a = net.attend(&k, &k, &k, &NoEncoding).unwrap().weights;
        let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let expected = [1.0, 0.0, 0.0, 1.0];
        for (a, e) in a.iter().zip(expected) {
            assert!((a - e).abs() < 1e-5, "{a:?}");
        }
    }

    /// The recurrence, the explicit matrix times the values and the chunked form agree in
    /// value and in the gradients of q, k, v and the per-token inputs, with and without the
    /// decay gate, at several lengths and chunk sizes, with and without RoPE.
    #[test]
    fn recurrent_explicit_and_chunked_forms_agree_in_value_and_gradient() {
        let rope = testing::rope();
        for gated in [false, true] {
            for (t, chunk) in [(1, 4), (7, 3), (16, 4), (13, 16), (9, 1)] {
                let [q, k, v] = testing::heads(t, "deltanet");
                let inputs = Var::from_tensor(&random(&[2, t, 4], 4, "deltanet")).unwrap();
                let net = layer(gated, chunk, inputs.as_tensor());
                for pos in [&NoEncoding as &dyn Encoding, rope.as_ref()] {
                    let (qn, kn) = (l2_normalised(&q).unwrap(), l2_normalised(&k).unwrap());
                    let (qr, kr) = pos.positioned(&qn, &kn).unwrap().unwrap();
                    let recurrent = recurrent_output(&net, &qr, &kr, &v);
                    let what = format!("gated {gated}, t {t}, chunk {chunk}");
                    let vars = [&q, &k, &v, &inputs];
                    testing::assert_forms_agree(&net, pos, &vars, &recurrent, &what);
                }
            }
        }
    }

    #[test]
    fn a_block_of_queries_gives_the_rows_of_the_whole_matrix() {
        let net = layer(true, 16, &random(&[1, 9, 4], 8, "deltanet"));
        testing::assert_blocks_give_rows(&net, &NoEncoding, "deltanet");
    }
}
