//! The rotary scalings applied to a RoPE-trained model at inference, without retraining, as
//! preset overrides that depend on the evaluation length n and the training length L:
//!
//! | variant | settings at length n |
//! |---|---|
//! | `pi` | positions / k, k = max(1, n/L): the longest distance maps into the trained range |
//! | `ntk` | base·α^(d/(d−2)), α = max(1, n/L) |
//! | `rerope` | window w = L/4 (the author's best w is L/4–L/2), with the post's log-n query scaling |
//! | `rerope no log-n` | the same without the log-n scaling, the post's plain ReRoPE-w rows |
//! | `rerope w=L/2` | window w = L/2, the other end of that range |
//! | `leaky-rerope` | w = L/4, k = max(1, (n−1−w)/(L−1−w)): the largest position is L−1, as the post's condition for staying in the trained range requires |

use crate::encodings::EncodingSpec;

/// One inference-time change of a run's encoding.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Appended to the run's name: `<run> + <label>`.
    pub label: &'static str,
    /// What is changed, for tables and JSON.
    pub description: &'static str,
    overrides: fn(usize, usize) -> Vec<String>,
}

impl Variant {
    /// The preset overrides at evaluation length `n` for training length `train`.
    pub fn overrides(&self, n: usize, train: usize) -> Vec<String> {
        (self.overrides)(n, train)
    }
}

fn ratio(n: usize, train: usize) -> f64 {
    (n as f64 / train as f64).max(1.0)
}

fn window(train: usize) -> usize {
    (train / 4).max(1)
}

/// The variants that apply to a run trained with `spec`: the four rotary scalings for RoPE,
/// none otherwise.
pub fn inference_variants(spec: &EncodingSpec) -> Vec<Variant> {
    if !matches!(spec, EncodingSpec::Rope(_)) {
        return Vec::new();
    }
    vec![
        Variant {
            label: "pi",
            description: "position interpolation, k = max(1, n/L)",
            overrides: |n, l| {
                vec![
                    "encoding.kind=pi".into(),
                    format!("encoding.scale={}", ratio(n, l)),
                ]
            },
        },
        Variant {
            label: "ntk",
            description: "NTK-aware base scaling, alpha = max(1, n/L)",
            overrides: |n, l| {
                vec![
                    "encoding.kind=ntk".into(),
                    format!("encoding.alpha={}", ratio(n, l)),
                ]
            },
        },
        Variant {
            label: "rerope",
            description: "ReRoPE, w = L/4",
            overrides: |_, l| {
                vec![
                    "encoding.kind=rerope".into(),
                    format!("encoding.window={}", window(l)),
                ]
            },
        },
        Variant {
            label: "rerope no log-n",
            description: "ReRoPE, w = L/4, queries not scaled by log n",
            overrides: |_, l| {
                vec![
                    "encoding.kind=rerope".into(),
                    format!("encoding.window={}", window(l)),
                    "encoding.log_n=false".into(),
                ]
            },
        },
        Variant {
            label: "rerope w=L/2",
            description: "ReRoPE, w = L/2 (the other end of the post's range)",
            overrides: |_, l| {
                vec![
                    "encoding.kind=rerope".into(),
                    format!("encoding.window={}", (l / 2).max(1)),
                ]
            },
        },
        Variant {
            label: "leaky-rerope",
            description: "Leaky ReRoPE, w = L/4, k = max(1, (n-1-w)/(L-1-w))",
            overrides: |n, l| {
                let w = window(l);
                let k = ((n as f64 - 1.0 - w as f64) / (l as f64 - 1.0 - w as f64)).max(1.0);
                vec![
                    "encoding.kind=leaky-rerope".into(),
                    format!("encoding.window={w}"),
                    format!("encoding.scale={k}"),
                ]
            },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encodings::Positions;

    #[test]
    fn leaky_rerope_keeps_the_largest_position_at_l_minus_one() {
        let variants = inference_variants(&EncodingSpec::Rope(Default::default()));
        let leaky = variants.iter().find(|v| v.label == "leaky-rerope").unwrap();
        let o = leaky.overrides(4096, 64);
        let k: f64 = o[2].trim_start_matches("encoding.scale=").parse().unwrap();
        let positions = Positions::Rectified {
            window: 16,
            leak: Some(k),
        };
        assert!((positions.effective(4095.0) - 63.0).abs() < 1e-9);
        assert!(inference_variants(&EncodingSpec::Alibi(Default::default())).is_empty());
    }
}
