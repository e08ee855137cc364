//! KERPLE (Chi et al. 2022, arXiv 2205.09921): learnable per-head kernels of the distance.
//! - `kerple-log`: p(t) = −r·ln(1 + k·t); Σ exp(p) converges only for r > 1.
//! - `kerple-power`: p(t) = −k·t^r with 0 < r ≤ 2; Σ exp(p) always converges.
//!
//! r and k are trainable per head and used clamped at 0.01 (r ≤ 2 for the power kernel), as
//! in the reference code; the clamp passes gradients straight through, so a parameter that
//! leaves the range can return. By default each head draws its own start from the run's seed
//! as the reference does (chijames/KERPLE `ParallelKerpleLog/Power`: r ~ U(0, 2),
//! k ~ U(0, 1)), so heads start apart and kerple-log is not Type 1 (r = 2, k = 1 makes
//! exp(p) = 1/(1 + t)²). Setting `r` or `k` starts every head there instead (attnlab's earlier
//! defaults were r = 2, k = 1 for the log kernel and r = 0.5, k = 1 for the power kernel).
//! One set of parameters serves all layers, as in the Rpe paper's fairseq-evo code.

use std::sync::Arc;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::relative::{LearnedBias, LearnedDistance, distance_row, head_values};
use super::{
    DistanceBias, Encoding, EncodingShape, EncodingSpec, Facts, Family, Variant, Verdict, known,
};
use crate::Result;
use crate::params::{Init, Params};
use crate::settings::{Settings, real};

/// The clamp of the reference implementation.
const MIN: f64 = 0.01;
/// The power kernel's largest exponent (conditionally positive definite up to 2).
const MAX_POWER: f64 = 2.0;

/// `kerple-log` initial values; unset = drawn per head as the reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KerpleLogConfig {
    /// Initial r (the power of the log kernel) of every head; > 1 makes Σ exp(bias) converge.
    /// Unset: r ~ U(0, 2) per head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r: Option<f64>,
    /// Initial k (the distance scale) of every head. Unset: k ~ U(0, 1) per head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k: Option<f64>,
}

/// `kerple-power` initial values; unset = drawn per head as the reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KerplePowerConfig {
    /// Initial exponent r of every head, in (0, 2]. Unset: r ~ U(0, 2) per head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r: Option<f64>,
    /// Initial scale k of every head. Unset: k ~ U(0, 1) per head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub k: Option<f64>,
}

/// The reference's start of r: U(0, 1)·2.
const R_DRAW: Init = Init::Between(0.0, 2.0);
/// The reference's start of k: U(0, 1).
const K_DRAW: Init = Init::Between(0.0, 1.0);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kernel {
    Log,
    Power,
}

pub struct Kerple {
    kernel: Kernel,
    /// (H, 1)
    r: Tensor,
    /// (H, 1)
    k: Tensor,
}

impl Kerple {
    pub fn log(c: &KerpleLogConfig, n_heads: usize, params: &Params) -> Result<Self> {
        Self::new(Kernel::Log, c.r, c.k, n_heads, params)
    }

    pub fn power(c: &KerplePowerConfig, n_heads: usize, params: &Params) -> Result<Self> {
        Self::new(Kernel::Power, c.r, c.k, n_heads, params)
    }

    fn new(
        kernel: Kernel,
        r: Option<f64>,
        k: Option<f64>,
        n_heads: usize,
        params: &Params,
    ) -> Result<Self> {
        let p = params.pp("kerple");
        let start = |value: Option<f64>, draw| value.map_or(draw, Init::Constant);
        Ok(Self {
            kernel,
            r: p.get("r", (n_heads, 1), start(r, R_DRAW))?,
            k: p.get("k", (n_heads, 1), start(k, K_DRAW))?,
        })
    }

    fn max_r(&self) -> f64 {
        match self.kernel {
            Kernel::Log => f64::MAX,
            Kernel::Power => MAX_POWER,
        }
    }
}

/// The bias of one head with fixed r and k, with its closed-form verdict.
fn head_bias(kernel: Kernel, r: f64, k: f64) -> Arc<dyn DistanceBias> {
    // Trained values come from f32: show 4 significant decimals, not 0.05000000074505806.
    let (rs, ks) = (short(r), short(k));
    match kernel {
        Kernel::Log => {
            let (verdict, reason) = if r > 1.0 {
                (
                    Verdict::Converges,
                    format!("(1 + {ks} t)^-{rs} is a p-series with p = {rs} > 1"),
                )
            } else {
                (
                    Verdict::Diverges,
                    format!("(1 + {ks} t)^-{rs} decays no faster than 1/t (r <= 1)"),
                )
            };
            known(move |t: f64| -r * (k * t).ln_1p(), verdict, reason)
        }
        Kernel::Power => known(
            move |t: f64| if t > 0.0 { -k * t.powf(r) } else { 0.0 },
            Verdict::Converges,
            format!("exp(-{ks} t^{rs}) decays faster than any power of t (k, r > 0)"),
        ),
    }
}

/// `x` clamped to [lo, hi] in the forward pass, with the gradient of the identity: a plain
/// clamp has zero gradient outside the range, so a parameter pushed past it (weight decay
/// keeps pushing towards 0) could never come back. The reference clamps the stored value after
/// each step instead, which leaves its gradient alive the same way.
fn clamped(x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    Ok((x + (x.clamp(lo, hi)? - x)?.detach())?)
}

/// `x` rounded to 4 decimals for messages.
fn short(x: f64) -> String {
    format!("{}", (x * 1e4).round() / 1e4)
}

impl LearnedDistance for Kerple {
    fn per_distance(&self, t: usize) -> Result<Tensor> {
        let r = clamped(&self.r, MIN, self.max_r())?;
        let k = clamped(&self.k, MIN, f64::MAX)?;
        let d = distance_row(t, self.r.device())?; // (1, t)
        Ok(match self.kernel {
            Kernel::Log => (k.broadcast_mul(&d)? + 1.0)?
                .log()?
                .broadcast_mul(&r)?
                .neg()?,
            Kernel::Power => {
                // t^r = exp(r·ln t), with ln t replaced by 0 at t = 0 and the result masked
                // there, so that neither the value nor the gradient in r meets ln 0.
                let ln_d = d.maximum(1.0)?.log()?;
                let far = d.minimum(1.0)?; // 0 at t = 0, 1 elsewhere
                let pow = r.broadcast_mul(&ln_d)?.exp()?.broadcast_mul(&far)?;
                pow.broadcast_mul(&k)?.neg()?
            }
        })
    }

    fn current(&self) -> Result<Vec<Arc<dyn DistanceBias>>> {
        let rs = head_values(&self.r)?;
        let ks = head_values(&self.k)?;
        Ok(rs
            .into_iter()
            .zip(ks)
            .map(|(r, k)| head_bias(self.kernel, r.clamp(MIN, self.max_r()), k.max(MIN)))
            .collect())
    }
}

static LOG_FACTS: Facts = Facts {
    name: "kerple-log",
    family: Family::Bias,
    learnable: true,
    formula: "bias = -r_h ln(1 + k_h t), r_h, k_h learned from U(0,2), U(0,1)",
    summary: "Chi et al. 2022: learned logarithmic kernel; converges iff r > 1.",
    settings: Settings::of(&[
        real(
            "r",
            0.01,
            10.0,
            "initial power r of every head; Σ exp(bias) converges for r > 1; unset = U(0, 2) per head",
        )
        .log(),
        real(
            "k",
            0.01,
            10.0,
            "initial distance scale k of every head; unset = U(0, 1) per head",
        )
        .log(),
    ]),
    default: || EncodingSpec::KerpleLog(KerpleLogConfig::default()),
};

impl Variant for KerpleLogConfig {
    const FACTS: &'static Facts = &LOG_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        LearnedBias::shared(params.device(), Kerple::log(self, shape.n_heads, params))
    }

    /// r and k per head.
    fn parameters(&self, shape: &EncodingShape) -> usize {
        2 * shape.n_heads
    }
}

static POWER_FACTS: Facts = Facts {
    name: "kerple-power",
    family: Family::Bias,
    learnable: true,
    formula: "bias = -k_h t^r_h, 0 < r_h <= 2, learned from U(0,2), U(0,1)",
    summary: "Chi et al. 2022: learned power kernel; always converges.",
    settings: Settings::of(&[
        real(
            "r",
            0.01,
            2.0,
            "initial exponent r of every head; unset = U(0, 2) per head",
        ),
        real(
            "k",
            0.01,
            10.0,
            "initial scale k of every head; unset = U(0, 1) per head",
        )
        .log(),
    ]),
    default: || EncodingSpec::KerplePower(KerplePowerConfig::default()),
};

impl Variant for KerplePowerConfig {
    const FACTS: &'static Facts = &POWER_FACTS;

    fn build(&self, shape: &EncodingShape, params: &Params) -> Result<Arc<dyn Encoding>> {
        LearnedBias::shared(params.device(), Kerple::power(self, shape.n_heads, params))
    }

    /// r and k per head.
    fn parameters(&self, shape: &EncodingShape) -> usize {
        2 * shape.n_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn check_tensor_matches_formula(kerple: &Kerple) {
        let table = kerple.per_distance(6).unwrap().to_vec2::<f32>().unwrap();
        let heads = kerple.current().unwrap();
        for (h, row) in table.iter().enumerate() {
            for (t, &v) in row.iter().enumerate() {
                assert!((v as f64 - heads[h].at(t as f64)).abs() < 1e-5, "{h} {t}");
            }
        }
    }

    #[test]
    fn log_kernel_matches_its_formula() {
        let p = Params::new(0, &Device::Cpu);
        let c = KerpleLogConfig {
            r: Some(2.0),
            k: Some(0.5),
        };
        let kerple = Kerple::log(&c, 2, &p).unwrap();
        check_tensor_matches_formula(&kerple);
        let heads = kerple.current().unwrap();
        assert!((heads[0].at(2.0) + 2.0 * 2f64.ln()).abs() < 1e-9);
    }

    #[test]
    fn power_kernel_matches_its_formula_and_is_clamped() {
        let p = Params::new(0, &Device::Cpu);
        let c = KerplePowerConfig {
            r: Some(3.0),
            k: Some(0.001),
        };
        let kerple = Kerple::power(&c, 1, &p).unwrap();
        check_tensor_matches_formula(&kerple);
        // r clamps to 2, k to 0.01
        assert!((kerple.current().unwrap()[0].at(3.0) + 0.09).abs() < 1e-9);
    }

    /// By default each head starts from its own draw, r in (0, 2) and k in (0, 1), the same
    /// for the same seed and different for another.
    #[test]
    fn unset_starts_are_drawn_per_head_from_the_seed() {
        let draw = |seed| {
            let p = Params::new(seed, &Device::Cpu);
            let kerple = Kerple::log(&KerpleLogConfig::default(), 8, &p).unwrap();
            (
                head_values(&kerple.r).unwrap(),
                head_values(&kerple.k).unwrap(),
            )
        };
        let (r, k) = draw(0);
        assert!(r.iter().all(|r| (0.0..2.0).contains(r)), "{r:?}");
        assert!(k.iter().all(|k| (0.0..1.0).contains(k)), "{k:?}");
        assert!(r.windows(2).any(|w| w[0] != w[1]), "heads differ: {r:?}");
        assert_eq!(draw(0), (r.clone(), k));
        assert_ne!(draw(1).0, r);
        // Over many heads the draws fill their ranges (mean near the middle).
        let p = Params::new(3, &Device::Cpu);
        let many = Kerple::power(&KerplePowerConfig::default(), 2000, &p).unwrap();
        let mean = |x: Vec<f64>| x.iter().sum::<f64>() / x.len() as f64;
        assert!((mean(head_values(&many.r).unwrap()) - 1.0).abs() < 0.05);
        assert!((mean(head_values(&many.k).unwrap()) - 0.5).abs() < 0.03);
    }

    /// Past the clamp the value is clamped but the gradient still flows.
    #[test]
    fn clamped_parameters_keep_their_gradient() {
        let p = Params::new(0, &Device::Cpu);
        let c = KerpleLogConfig {
            r: Some(0.001),
            k: Some(1.0),
        };
        let kerple = Kerple::log(&c, 1, &p).unwrap();
        let loss = kerple.per_distance(4).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let g = grads.get(&kerple.r).unwrap().flatten_all().unwrap();
        assert!(g.to_vec1::<f32>().unwrap()[0] != 0.0);
        let row = kerple.per_distance(2).unwrap().to_vec2::<f32>().unwrap();
        assert!((row[0][1] as f64 + 0.01 * 2f64.ln()).abs() < 1e-6);
    }
}
