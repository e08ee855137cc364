//! ALiBi (Press, Smith, Lewis 2022, arXiv 2108.12409): logit bias b_h(n) = −m_h·n at distance
//! n = i − j, with the geometric slopes of the reference `get_slopes` (ofirpress/
//! attention_with_linear_biases): for H a power of two, m_h = 2^(−8h/H), h = 1..H; otherwise
//! the slopes of the closest smaller power of two, then every other slope of the next one.

use candle_core::{Device, Tensor};

use super::{Encoding, LengthCache};
use crate::Result;

pub struct Alibi {
    slopes: Vec<f64>,
    device: Device,
    cache: LengthCache,
}

impl Alibi {
    pub fn new(n_heads: usize, device: &Device) -> Self {
        Self {
            slopes: alibi_slopes(n_heads),
            device: device.clone(),
            cache: LengthCache::default(),
        }
    }
}

/// The reference `get_slopes(n)`.
pub fn alibi_slopes(n_heads: usize) -> Vec<f64> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0))));
        (0..n).map(|i| start * start.powi(i as i32)).collect()
    }
    if n_heads == 0 {
        return Vec::new();
    }
    if n_heads.is_power_of_two() {
        return power_of_two(n_heads);
    }
    let closest = 1usize << n_heads.ilog2();
    let mut slopes = power_of_two(closest);
    slopes.extend(
        alibi_slopes(2 * closest)
            .into_iter()
            .step_by(2)
            .take(n_heads - closest),
    );
    slopes
}

impl Encoding for Alibi {
    fn logit_bias(&self, t: usize) -> Result<Option<Tensor>> {
        let bias = self.cache.get_or(t, || {
            let h = self.slopes.len();
            let mut data = vec![0f32; h * t * t];
            for (head, slope) in self.slopes.iter().enumerate() {
                for i in 0..t {
                    for j in 0..=i {
                        data[(head * t + i) * t + j] = (-slope * (i - j) as f64) as f32;
                    }
                }
            }
            Ok(Tensor::from_vec(data, (h, t, t), &self.device)?)
        })?;
        Ok(Some(bias))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_for_eight_heads_are_powers_of_two() {
        let want: Vec<f64> = (1..=8).map(|i| 2f64.powi(-i)).collect();
        assert_eq!(alibi_slopes(8), want);
    }

    #[test]
    fn slopes_for_non_powers_of_two_follow_the_reference() {
        // get_slopes(6) = get_slopes(4) + get_slopes(8)[0::2][:2]
        let want = vec![0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125];
        let got = alibi_slopes(6);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
    }

    #[test]
    fn bias_is_minus_slope_times_distance() {
        let alibi = Alibi::new(2, &Device::Cpu);
        let bias = alibi
            .logit_bias(4)
            .unwrap()
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        // 2 heads: slopes 2^-4, 2^-8
        assert_eq!(bias[0][3][0], -3.0 / 16.0);
        assert_eq!(bias[1][2][1], -1.0 / 256.0);
        assert_eq!(bias[0][2][2], 0.0);
    }
}
