//! NoPE: no positional encoding; causal masking alone carries order (a baseline). Seen as a
//! relative bias it is p(t) = 0 at every distance, which is how the TRF/ERF analyses study it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{
    DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant, Verdict, known,
};
use crate::Result;
use crate::params::Params;
use crate::settings::Settings;

/// NoPE's settings (none).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NoneConfig {}

static FACTS: Facts = Facts {
    name: "none",
    family: Family::None,
    learnable: false,
    formula: "no positional term",
    summary: "NoPE: causal masking alone carries order (a baseline).",
    settings: Settings::NONE,
    default: || EncodingSpec::None(NoneConfig::default()),
};

impl Variant for NoneConfig {
    const FACTS: &'static Facts = &FACTS;

    fn build(&self, shape: &EncodingShape, _params: &Params) -> Result<Arc<dyn Encoding>> {
        Ok(Arc::new(ZeroBias {
            n_heads: shape.n_heads,
        }))
    }

    fn parameters(&self, _shape: &EncodingShape) -> usize {
        0
    }
}

/// NoPE seen as a relative bias: p(t) = 0 at every distance.
struct ZeroBias {
    n_heads: usize,
}

impl Encoding for ZeroBias {
    fn distance_biases(&self) -> Result<Option<Vec<Arc<dyn DistanceBias>>>> {
        let zero = known(
            |_t: f64| 0.0,
            Verdict::Diverges,
            "a zero bias sums 1 + 1 + 1 + …",
        );
        Ok(Some(vec![zero; self.n_heads]))
    }
}
