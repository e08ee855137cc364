//! RoPE's content-free long-range decay (RoFormer §3.4.3), shown for rotary encodings in
//! place of a TRF: they add no bias, so Σ exp(bias) says nothing about them.

/// RoFormer's decay bound at each relative distance t: (1/(d/2))·Σ_{j=1}^{d/2} |S_j|, with
/// S_j = Σ_{i=0}^{j−1} e^{i·t·θ_i} the complex partial sums over the per-pair frequencies
/// `thetas` (θ_i for i = 0..d/2). The attention logit of a rotated pair is bounded by this
/// times the largest step of the content sequence, so a smaller value means less attention
/// can reach that far whatever the content.
///
/// At t = 0 every |S_j| = j and the value is (d/2 + 1)/2. No frequencies gives 0.
pub fn rotary_decay(thetas: &[f64], distances: &[f64]) -> Vec<f64> {
    distances
        .iter()
        .map(|&t| mean_partial_sum_norm(thetas, t))
        .collect()
}

/// (1/(d/2))·Σ_j |S_j| at distance t.
fn mean_partial_sum_norm(thetas: &[f64], t: f64) -> f64 {
    if thetas.is_empty() {
        return 0.0;
    }
    let (mut re, mut im, mut norms) = (0.0, 0.0, 0.0);
    for theta in thetas {
        let (sin, cos) = (t * theta).sin_cos();
        re += cos;
        im += sin;
        norms += re.hypot(im);
    }
    norms / thetas.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope_thetas(d: usize) -> Vec<f64> {
        (0..d / 2)
            .map(|i| 10_000f64.powf(-2.0 * i as f64 / d as f64))
            .collect()
    }

    #[test]
    fn decay_at_zero_is_the_mean_of_one_to_half_d() {
        let thetas = rope_thetas(64);
        assert!((rotary_decay(&thetas, &[0.0])[0] - 16.5).abs() < 1e-12);
        assert_eq!(rotary_decay(&[], &[0.0, 3.0]), vec![0.0, 0.0]);
    }

    #[test]
    fn decay_falls_with_distance_on_average() {
        let thetas = rope_thetas(64);
        let mean = |from: usize, to: usize| {
            let ts: Vec<f64> = (from..=to).map(|t| t as f64).collect();
            rotary_decay(&thetas, &ts).iter().sum::<f64>() / ts.len() as f64
        };
        let (near, far) = (mean(0, 10), mean(200, 300));
        assert!(far < 0.6 * near, "near {near}, far {far}");
    }

    #[test]
    fn one_pair_has_norm_one_everywhere() {
        assert_eq!(rotary_decay(&[0.3], &[0.0, 1.0, 7.5]), vec![1.0, 1.0, 1.0]);
    }
}
