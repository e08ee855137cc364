//! Learned relative biases kept as a table of scalars per head, looked up by a bucket of the
//! distance:
//! - `t5` (Raffel et al. 2020): log-spaced buckets, HF `T5Attention._relative_position_bucket`
//!   in its causal form (32 buckets, max distance 128); one table for all layers, as in T5.
//! - `diet-rel` (Chen et al. 2021, DIET): one scalar per distance, clipped at `max_distance`;
//!   no sharing across layers by default (the paper's recommendation), layer-wise optionally.
//!
//! Tables start at zero (the model begins as NoPE and learns the bias), which also keeps the
//! formula-only analyses of an untrained encoding reproducible.

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::relative::{LearnedBias, LearnedDistance};
use super::{
    DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, LengthCache, Variant,
    Verdict, known,
};
use crate::params::{Init, Params};
use crate::settings::{Choices, Settings, Switch, real};
use crate::{Error, Result};

/// `t5` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct T5Config {
    pub num_buckets: usize,
    /// Distances from here on share the last bucket.
    pub max_distance: usize,
}

impl Default for T5Config {
    fn default() -> Self {
        Self {
            num_buckets: 32,
            max_distance: 128,
        }
    }
}

/// Whether a DIET table is shared by the layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DietSharing {
    /// Every layer has its own (DIET's recommendation for DIET-REL).
    #[default]
    None,
    /// One for all layers, separate per head (DIET's recommendation for DIET-ABS).
    Layerwise,
}

/// `diet-rel` settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DietRelConfig {
    /// Distances from here on share one scalar. Unset: no clipping, as in the paper, one
    /// scalar per distance up to the training length (attnlab's earlier default was 128).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_distance: Option<usize>,
    pub sharing: DietSharing,
}

impl Default for DietRelConfig {
    fn default() -> Self {
        Self {
            max_distance: None,
            sharing: DietSharing::None,
        }
    }
}

/// The causal T5 bucket of distance `t` (HF's function with `bidirectional = False`).
pub fn t5_bucket(t: usize, num_buckets: usize, max_distance: usize) -> usize {
    let max_exact = num_buckets / 2;
    if t < max_exact {
        return t;
    }
    let log_ratio =
        ((t as f64) / max_exact as f64).ln() / (max_distance as f64 / max_exact as f64).ln();
    let bucket = max_exact + (log_ratio * (num_buckets - max_exact) as f64) as usize;
    bucket.min(num_buckets - 1)
}

type Bucket = Arc<dyn Fn(usize) -> usize + Send + Sync>;

/// A per-head table of learned scalars indexed by `bucket(distance)`.
pub struct TableBias {
    /// (H, buckets)
    table: Tensor,
    bucket: Bucket,
    indices: LengthCache,
}

impl TableBias {
    pub fn t5(c: &T5Config, n_heads: usize, params: &Params) -> Result<Self> {
        let (n, max) = (c.num_buckets, c.max_distance);
        let table = params
            .pp("t5")
            .get("table", (n_heads, n), Init::Constant(0.0))?;
        Ok(Self::new(table, Arc::new(move |t| t5_bucket(t, n, max))))
    }

    /// The DIET-REL table; unclipped (`max_distance` unset) it holds distances up to
    /// `max_len` − 1.
    pub fn diet_rel(
        c: &DietRelConfig,
        n_heads: usize,
        max_len: usize,
        params: &Params,
    ) -> Result<Self> {
        let max = c.max_distance.unwrap_or(max_len.saturating_sub(1).max(1));
        let table = params
            .pp("diet_rel")
            .get("table", (n_heads, max + 1), Init::Constant(0.0))?;
        Ok(Self::new(table, Arc::new(move |t| t.min(max))))
    }

    fn new(table: Tensor, bucket: Bucket) -> Self {
        Self {
            table,
            bucket,
            indices: LengthCache::default(),
        }
    }
}

impl LearnedDistance for TableBias {
    fn per_distance(&self, t: usize) -> Result<Tensor> {
        let index = self.indices.get_or(t, || {
            let buckets: Vec<u32> = (0..t).map(|d| (self.bucket)(d) as u32).collect();
            Ok(Tensor::from_vec(buckets, t, self.table.device())?)
        })?;
        // The distances are the last dimension, after the replicas' if there are any.
        Ok(self.table.index_select(&index, self.table.rank() - 1)?)
    }

    fn current(&self) -> Result<Vec<Arc<dyn DistanceBias>>> {
        let rows = self.table.to_vec2::<f32>()?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let bucket = self.bucket.clone();
                let last = f64::from(row.last().copied().unwrap_or(0.0));
                let reason = format!(
                    "the table is constant beyond its last bucket, so b_t stays at exp({last:.3}) > 0"
                );
                let bias = move |t: f64| {
                    let d = if t.is_finite() {
                        t.max(0.0) as usize
                    } else {
                        usize::MAX
                    };
                    f64::from(row[bucket(d)])
                };
                known(bias, Verdict::Diverges, reason)
            })
            .collect())
    }
}

/// The sharing switch of both DIET encodings.
pub(super) const DIET_SHARING: &[Switch] = &[Switch {
    key: "sharing",
    label: "sharing",
    choices: Choices::Words(&["none", "layerwise"]),
}];

static T5_FACTS: Facts = Facts {
    name: "t5",
    family: Family::Bias,
    learnable: true,
    formula: "bias = b_h[bucket(t)], log-spaced buckets, learned",
    summary: "Raffel et al. 2020: learned bias per log-spaced distance bucket.",
    settings: Settings::of(&[
        real("num_buckets", 2.0, 1024.0, "distance buckets per head").whole(),
        real(
            "max_distance",
            1.0,
            1_048_576.0,
            "distances from here share the last bucket",
        )
        .whole(),
    ]),
    default: || EncodingSpec::T5(T5Config::default()),
};

impl Variant for T5Config {
    const FACTS: &'static Facts = &T5_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        LearnedBias::shared(params.device(), TableBias::t5(self, shape.n_heads, params))
    }

    /// One scalar per head and bucket.
    fn parameters(&self, shape: &EncodingShape) -> usize {
        shape.n_heads * self.num_buckets
    }

    fn validate(&self, _shape: &EncodingShape) -> Result<()> {
        if self.max_distance > self.num_buckets / 2 {
            return Ok(());
        }
        Err(Error::preset(
            "encoding.max_distance",
            self.max_distance,
            format!(
                "must exceed num_buckets / 2 = {} (the exact buckets)",
                self.num_buckets / 2
            ),
        ))
    }
}

static DIET_REL_FACTS: Facts = Facts {
    name: "diet-rel",
    family: Family::Bias,
    learnable: true,
    formula: "bias = b_h[min(t, max_distance)], learned",
    summary: "Chen et al. 2021 (DIET): learned bias per clipped distance.",
    settings: Settings {
        numbers: &[real(
            "max_distance",
            1.0,
            65_536.0,
            "distances from here share one scalar; unset = unclipped (the paper), one per trained distance",
        )
        .whole()],
        switches: DIET_SHARING,
    },
    default: || EncodingSpec::DietRel(DietRelConfig::default()),
};

impl Variant for DietRelConfig {
    const FACTS: &'static Facts = &DIET_REL_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        let table = TableBias::diet_rel(self, shape.n_heads, shape.max_len, params);
        LearnedBias::shared(params.device(), table)
    }

    /// One scalar per head and distance up to the clip (unclipped: every trained distance).
    fn parameters(&self, shape: &EncodingShape) -> usize {
        shape.n_heads * self.max_distance.map_or(shape.max_len, |m| m + 1)
    }

    fn is_per_layer(&self) -> bool {
        self.sharing == DietSharing::None
    }

    fn at_training_length(&mut self, len: usize) {
        self.max_distance
            .get_or_insert(len.saturating_sub(1).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::EncodingSpec;
    use crate::settings::Section;
    use candle_core::Device;

    /// HF's `_relative_position_bucket(-t, bidirectional=False, 32, 128)`, ported to Python
    /// line by line and evaluated at these distances.
    #[test]
    fn t5_buckets_match_the_reference() {
        let got: Vec<usize> = [0, 1, 15, 16, 20, 32, 64, 100, 127, 128, 5000]
            .iter()
            .map(|&t| t5_bucket(t, 32, 128))
            .collect();
        assert_eq!(got, vec![0, 1, 15, 16, 17, 21, 26, 30, 31, 31, 31]);
    }

    #[test]
    fn diet_rel_clips_the_distance() {
        let p = Params::new(0, &Device::Cpu);
        let c = DietRelConfig {
            max_distance: Some(2),
            ..Default::default()
        };
        let bias = TableBias::diet_rel(&c, 1, 64, &p).unwrap();
        let table = Tensor::new(&[[0f32, -1.0, -2.0]], &Device::Cpu).unwrap();
        let bias = TableBias::new(table, bias.bucket.clone());
        let row = bias.per_distance(5).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(row[0], vec![0.0, -1.0, -2.0, -2.0, -2.0]);
        assert_eq!(bias.current().unwrap()[0].at(1e9), -2.0);
    }

    /// By default nothing is clipped: one entry per distance of the sequence.
    #[test]
    fn diet_rel_is_unclipped_by_default() {
        let p = Params::new(0, &Device::Cpu);
        let bias = TableBias::diet_rel(&DietRelConfig::default(), 2, 300, &p).unwrap();
        assert_eq!(bias.table.dims(), &[2, 300]);
        assert_eq!((bias.bucket)(299), 299);
        let trained = EncodingSpec::DietRel(DietRelConfig::default()).at_training_length(64);
        assert_eq!(trained.value("max_distance"), Some(63.0));
    }
}
