//! Absolute encodings, added to the token embeddings: learned (GPT-2) and sinusoidal
//! (Vaswani et al. 2017, arXiv 1706.03762): P[t, 2i] = sin(t / 10000^(2i/d)),
//! P[t, 2i+1] = cos(t / 10000^(2i/d)).

use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::{Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant};
use crate::ops::add_broadcast;
use crate::params::{Init, Params};
use crate::settings::Settings;
use crate::{Error, Result};

/// A learned table of `max_len` position vectors, initialised like the token embedding
/// (N(0, 1) like PyTorch's `nn.Embedding`, or N(0, 0.02) in the zoology layout).
pub struct Learned {
    table: Tensor,
}

impl Learned {
    pub fn new(shape: &EncodingShape, params: &Params) -> Result<Self> {
        let table = params.get(
            "pos_embedding",
            (shape.max_len, shape.d_model),
            Init::Normal(shape.embedding_std),
        )?;
        Ok(Self { table })
    }
}

/// x (B, T, D) + table[0..T], with a clear error past the table's end. A replicated table
/// (R, max_len, D) adds replica r's rows to replica r's block of x (R·B, T, D).
fn add_table(x: &Tensor, table: &Tensor, what: &str) -> Result<Tensor> {
    let t = x.dim(1)?;
    let positions = table.rank() - 2;
    let max_len = table.dim(positions)?;
    if t > max_len {
        return Err(Error::argument(
            "sequence length",
            t,
            format!("is longer than the {what} table ({max_len} positions)"),
        ));
    }
    let rows = table.narrow(positions, 0, t)?;
    if positions == 1 {
        return crate::ops::per_replica(x, &rows, crate::ops::Combine::Add);
    }
    add_broadcast(x, &rows)
}

impl Encoding for Learned {
    fn add_to_input(&self, x: &Tensor) -> Result<Tensor> {
        add_table(x, &self.table, "learned position")
    }
}

/// The fixed sinusoidal table.
pub struct Sinusoidal {
    table: Tensor,
}

impl Sinusoidal {
    pub fn new(shape: &EncodingShape, device: &Device) -> Result<Self> {
        let table = Tensor::from_vec(
            sinusoidal_table(shape.max_len, shape.d_model),
            (shape.max_len, shape.d_model),
            device,
        )?;
        Ok(Self { table })
    }
}

impl Encoding for Sinusoidal {
    fn add_to_input(&self, x: &Tensor) -> Result<Tensor> {
        add_table(x, &self.table, "sinusoidal position")
    }
}

/// Row-major (len, d) sinusoidal table.
pub fn sinusoidal_table(len: usize, d: usize) -> Vec<f32> {
    let mut table = vec![0f32; len * d];
    for t in 0..len {
        for col in 0..d {
            let i = (col / 2) as f64;
            let angle = t as f64 / 10_000f64.powf(2.0 * i / d as f64);
            table[t * d + col] = if col % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            } as f32;
        }
    }
    table
}

/// Learned absolute positions' settings (none).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LearnedConfig {}

static LEARNED_FACTS: Facts = Facts {
    name: "learned",
    family: Family::Absolute,
    learnable: true,
    formula: "x_t + p_t, p learned",
    summary: "GPT-style learned table; cannot go past its trained length.",
    settings: Settings::NONE,
    default: || EncodingSpec::Learned(LearnedConfig::default()),
};

impl Variant for LearnedConfig {
    const FACTS: &'static Facts = &LEARNED_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(Arc::new(Learned::new(shape, params)?))
    }

    /// One d-wide vector per position.
    fn parameters(&self, shape: &EncodingShape) -> usize {
        shape.max_len * shape.d_model
    }
}

/// Sinusoidal positions' settings (none).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SinusoidalConfig {}

static SINUSOIDAL_FACTS: Facts = Facts {
    name: "sinusoidal",
    family: Family::Absolute,
    learnable: false,
    formula: "x_t + [sin(t/10000^(2i/d)), cos(t/10000^(2i/d))]",
    summary: "Vaswani et al. 2017: fixed sinusoids added to the input.",
    settings: Settings::NONE,
    default: || EncodingSpec::Sinusoidal(SinusoidalConfig::default()),
};

impl Variant for SinusoidalConfig {
    const FACTS: &'static Facts = &SINUSOIDAL_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(Arc::new(Sinusoidal::new(shape, params.device())?))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoidal_matches_the_formula() {
        let table = sinusoidal_table(5, 4);
        // t = 3, i = 1: angle = 3 / 10000^(2/4) = 0.03
        assert!((table[3 * 4 + 2] - 0.03f32.sin()).abs() < 1e-6);
        assert!((table[3 * 4 + 3] - 0.03f32.cos()).abs() < 1e-6);
        assert_eq!(table[0], 0.0);
        assert_eq!(table[1], 1.0);
    }
}
