//! DIET-ABS (Chen et al. 2021, "A Simple and Effective Positional Encoding for Transformers"):
//! a positional attention term decoupled from the content, added to the logits of each head:
//! A_ij = q_i·k_j/√d + (P_Q P_Kᵀ)_ij with P_Q, P_K ∈ R^{n×d_p} learned per head. It is absolute
//! (it depends on i and j, not only on i − j), so it has no distance profile and no
//! convergence verdict; its exp(bias) heatmap shows what it learned.
//!
//! Defaults follow the paper: d_p = the per-head query width, shared across layers
//! (`sharing = "layerwise"`, its recommendation), separate per head.

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::table::{DIET_SHARING, DietSharing};
use super::{Encoding, EncodingShape, EncodingSpec, Facts, Family, QueryBlock, Variant};
use crate::params::{Init, Params};
use crate::settings::{Settings, real};
use crate::{Error, Result};

/// `diet-abs` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DietAbsConfig {
    /// d_p, the rank of P_Q P_Kᵀ; absent = the per-head query width (the paper's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    pub sharing: DietSharing,
}

impl Default for DietAbsConfig {
    fn default() -> Self {
        Self {
            rank: None,
            sharing: DietSharing::Layerwise,
        }
    }
}

pub struct DietAbs {
    /// (H, max_len, d_p)
    p_q: Tensor,
    /// (H, max_len, d_p)
    p_k: Tensor,
}

impl DietAbs {
    pub fn new(c: &DietAbsConfig, shape: &EncodingShape, params: &Params) -> Result<Self> {
        let rank = c.rank.unwrap_or(shape.qk_dim);
        // Entries of P_Q P_Kᵀ start with a standard deviation of about 0.1: small next to the
        // content logits, large enough for both factors to get a gradient.
        let init = Init::Normal((0.01 / rank as f64).powf(0.25));
        let p = params.pp("diet_abs");
        let dims = (shape.n_heads, shape.max_len, rank);
        Ok(Self {
            p_q: p.get("p_q", dims, init)?,
            p_k: p.get("p_k", dims, init)?,
        })
    }
}

impl Encoding for DietAbs {
    fn has_logit_bias(&self) -> bool {
        true
    }

    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        self.block_bias(QueryBlock::whole(t))
    }

    /// (H, len, keys), or (R, H, len, keys) with replicas.
    fn block_bias(&self, block: QueryBlock) -> Result<Option<Tensor>> {
        let positions = self.p_q.rank() - 2;
        let max_len = self.p_q.dim(positions)?;
        let t = block.keys();
        if t > max_len {
            return Err(Error::argument(
                "sequence length",
                t,
                format!("is longer than the {max_len} positions DIET-ABS has embeddings for"),
            ));
        }
        let p_q = self.p_q.narrow(positions, block.start, block.len)?;
        let p_k = self.p_k.narrow(positions, 0, t)?;
        let p_k_t = p_k.transpose(positions, positions + 1)?.contiguous()?;
        Ok(Some(p_q.contiguous()?.matmul(&p_k_t)?))
    }
}

static FACTS: Facts = Facts {
    name: "diet-abs",
    family: Family::Bias,
    learnable: true,
    formula: "bias_ij = (P_Q P_K^T)_ij per head, learned",
    summary: "Chen et al. 2021 (DIET): decoupled absolute positions in the scores.",
    settings: Settings {
        numbers: &[real("rank", 1.0, 1024.0, "d_p, the rank of P_Q P_K^T").whole()],
        switches: DIET_SHARING,
    },
    default: || EncodingSpec::DietAbs(DietAbsConfig::default()),
};

impl Variant for DietAbsConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(Arc::new(DietAbs::new(self, shape, params)?))
    }

    /// P_Q and P_K: a rank-d_p row per head and position.
    fn parameters(&self, shape: &EncodingShape) -> usize {
        2 * shape.n_heads * shape.max_len * self.rank.unwrap_or(shape.qk_dim)
    }

    fn is_per_layer(&self) -> bool {
        self.sharing == DietSharing::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn bias_is_the_product_of_the_two_tables() {
        let shape = EncodingShape {
            d_model: 8,
            n_heads: 2,
            qk_dim: 4,
            max_len: 5,
            embedding_std: 1.0,
        };
        let p = Params::new(0, &Device::Cpu);
        let diet = DietAbs::new(&DietAbsConfig::default(), &shape, &p).unwrap();
        let bias = diet.logit_bias(3).unwrap().unwrap();
        assert_eq!(bias.dims(), &[2, 3, 3]);
        let q = diet.p_q.get(1).unwrap().get(2).unwrap();
        let k = diet.p_k.get(1).unwrap().get(0).unwrap();
        let want = (q * k)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let got = bias.get(1).unwrap().get(2).unwrap().get(0).unwrap();
        assert!((got.to_scalar::<f32>().unwrap() - want).abs() < 1e-6);
        assert!(diet.logit_bias(6).is_err());
    }
}
