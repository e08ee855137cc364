//! Linformer (Wang et al. 2020, arXiv 2006.04768): keys and values are projected along the
//! sequence, K' = E·K and V' = F·V with E, F of shape (k, n), so the attention matrix is
//! softmax(Q K'ᵀ/√d), of shape n × k.
//!
//! Sharing modes are the paper's §4: `none` (E, F per head), `headwise` (one E, F per layer;
//! what the official fairseq code does by default), `kv` (E = F per layer) and `layerwise`
//! (one E for keys and values of every layer). Projections are initialised like fairseq's
//! (`xavier_uniform`, gain 1/√2). Inputs shorter than n use the first columns of E and F.
//! The projection mixes future positions into every key, so Linformer is not causal: tasks
//! that need causality (language modelling) reject it.

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::{
    Attention, Facts, LayerSize, Mechanism, MechanismShape, MechanismSpec, MemoryTerms, Mixing,
    StateShape, StateSize, Variant,
};
use crate::encodings::{Encoding, QueryBlock};
use crate::ops::{Precision, dot_scores, softmax_rows};
use crate::params::{Init, Params};
use crate::settings::{Choices, Settings, Switch, real};
use crate::{Error, Result};

/// Linformer settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinformerConfig {
    /// Projected length k (the paper compresses n by 4 by default).
    pub proj_dim: usize,
    pub sharing: LinformerSharing,
}

impl Default for LinformerConfig {
    fn default() -> Self {
        Self {
            proj_dim: 16,
            sharing: LinformerSharing::Headwise,
        }
    }
}

/// Which projections are shared (paper §4, "Additional efficiency techniques").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinformerSharing {
    /// Separate E and F for every head.
    None,
    /// One E and one F per layer.
    #[default]
    Headwise,
    /// One E per layer, used for keys and values.
    Kv,
    /// One E for keys and values of all layers.
    Layerwise,
}

static FACTS: Facts = Facts {
    name: "linformer",
    formula: "A = softmax(q (E k)^T / sqrt(d)), n x k, non-causal",
    summary: "Wang et al. 2020: keys and values projected to k rows, O(nk).",
    causal: false,
    keys_have_positions: false,
    mixing: Mixing::RowStochastic,
    state: "n/a: not causal, no recurrent form",
    settings: Settings {
        numbers: &[real(
            "proj_dim",
            1.0,
            65_536.0,
            "projected length k; at most the task's sequence length",
        )
        .whole()],
        switches: &[Switch {
            key: "sharing",
            label: "sharing",
            choices: Choices::Words(&["none", "headwise", "kv", "layerwise"]),
        }],
    },
    default: || MechanismSpec::Linformer(LinformerConfig::default()),
};

impl Variant for LinformerConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &MechanismShape, params: &Params) -> Result<Arc<dyn Mechanism>> {
        Ok(Arc::new(Linformer::new(self, shape, params)?))
    }

    /// E and F, one (k, n) projection each per head, per layer or shared; each query scores
    /// the k projected rows.
    fn memory(&self, layer: &LayerSize) -> MemoryTerms {
        let projection = self.proj_dim as f64 * layer.len;
        MemoryTerms {
            parameters: match self.sharing {
                LinformerSharing::None => 2.0 * layer.heads * projection,
                LinformerSharing::Headwise => 2.0 * projection,
                LinformerSharing::Kv | LinformerSharing::Layerwise => projection,
            },
            keys: self.proj_dim as f64,
            ..MemoryTerms::plain(layer)
        }
    }

    /// `linformer-k<k>`: the projected length is its point on a plot.
    fn label(&self) -> String {
        format!("{}-k{}", FACTS.name, self.proj_dim)
    }

    /// Every key mixes the whole sequence: there is no state to carry.
    fn state(&self, _layer: &StateShape) -> Option<StateSize> {
        None
    }

    /// Linformer has no fused path.
    fn trains_fused(&self) -> bool {
        false
    }

    fn validate(&self, seq_len: usize) -> Result<()> {
        if self.proj_dim == 0 || self.proj_dim > seq_len {
            return Err(Error::preset(
                "attention.proj_dim",
                self.proj_dim,
                format!("must be in 1..={seq_len} (the task's sequence length)"),
            ));
        }
        Ok(())
    }
}

pub struct Linformer {
    /// (H or 1, k, n)
    e: Tensor,
    /// (H or 1, k, n)
    f: Tensor,
    scale: f64,
    precision: Precision,
}

impl Linformer {
    pub fn new(config: &LinformerConfig, shape: &MechanismShape, params: &Params) -> Result<Self> {
        let (k, n) = (config.proj_dim, shape.max_len);
        let bound = (0.5f64).sqrt() * (6.0 / (k + n) as f64).sqrt();
        let init = Init::Uniform(bound);
        let heads = match config.sharing {
            LinformerSharing::None => shape.n_heads,
            _ => 1,
        };
        let (e, f) = match config.sharing {
            LinformerSharing::None | LinformerSharing::Headwise => (
                params.get("proj_k", (heads, k, n), init)?,
                params.get("proj_v", (heads, k, n), init)?,
            ),
            LinformerSharing::Kv => {
                let e = params.get("proj_kv", (1, k, n), init)?;
                (e.clone(), e)
            }
            LinformerSharing::Layerwise => {
                let e = params
                    .root()
                    .get("linformer_shared_proj", (1, k, n), init)?;
                (e.clone(), e)
            }
        };
        Ok(Self {
            e,
            f,
            scale: 1.0 / (shape.qk_dim as f64).sqrt(),
            precision: shape.precision,
        })
    }
}

/// proj (Hp, k, n) applied along the sequence of x (B, H, t, d) → (B, H, k, d). With replicas
/// proj is (R, Hp, k, n) and replica r's projection acts on its block of x (R·B, H, t, d).
fn project(proj: &Tensor, x: &Tensor) -> Result<Tensor> {
    let (b, h, t, _) = x.dims4()?;
    let last = proj.rank() - 1;
    let (k, n) = (proj.dim(last - 1)?, proj.dim(last)?);
    if t > n {
        return Err(Error::argument(
            "sequence length",
            t,
            format!("is longer than the {n} tokens Linformer was built for"),
        ));
    }
    let proj = proj.narrow(last, 0, t)?;
    let proj = match proj.rank() {
        4 => {
            let replicas = proj.dim(0)?;
            proj.unsqueeze(1)?
                .broadcast_as((replicas, b / replicas, h, k, t))?
                .reshape((b, h, k, t))?
        }
        _ => proj
            .unsqueeze(0)?
            .broadcast_as((b, h, k, t))?
            .contiguous()?,
    };
    Ok(proj.matmul(&x.contiguous()?)?)
}

impl Mechanism for Linformer {
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, _pos: &dyn Encoding) -> Result<Attention> {
        let keys = project(&self.e, k)?; // (B, H, k, d)
        let scores = self
            .precision
            .product(q, &keys, |q, k| dot_scores(q, k, self.scale))?; // (B, H, T, k)
        Ok(Attention {
            weights: softmax_rows(&scores, false)?,
            values: project(&self.f, v)?,
        })
    }

    /// Only the whole sequence: the projection mixes every position into every key.
    fn attend_block(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        pos: &dyn Encoding,
        block: QueryBlock,
    ) -> Result<Attention> {
        if block == QueryBlock::whole(block.total) {
            return self.attend(q, k, v, pos);
        }
        Err(Error::unsupported(
            "evaluating linformer in blocks of queries",
            "it is not causal, its keys are projected along the whole sequence",
        ))
    }
}
