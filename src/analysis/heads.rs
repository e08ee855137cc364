//! Per-head diagnostics of a model's attention, as TransformerLens defines them, on its
//! induction probe: `rows` sequences of `half` uniformly random tokens repeated twice, after
//! the model's beginning-of-sequence token where it has one (TransformerLens prepends it).
//!
//! - induction: TransformerLens's `pattern.diagonal(1 − half).mean()`, the weights of query q
//!   on key q + 1 − half for every q from half − 1 on: for a query in the second copy (query
//!   o + half + i, o = 1 after the first token, else 0) the token after its earlier occurrence
//!   (key o + i + 1); the diagonal also takes the one or two queries just before the second
//!   copy, as TransformerLens's mean does;
//! - previous token: the mean weight on the key just before the query;
//! - first token: the mean weight on position 0 (the "attention sink"), queries 1 on;
//! - entropy: the mean entropy of the rows, in nats, queries 1 on (row 0 has one key);
//! - induction IoU (issue 30's reading, with attnlab's IoU code, [`crate::analysis::iou`]):
//!   the second copy's queries o + half + i against the ground truth key o + i + 1, hard
//!   (threshold τ 0.1, pooled over the queries) and soft (Σmin/Σmax) over their whole rows.
//!
//! Each is averaged over heads' rows and the probe's sequences.

use candle_core::Tensor;
use serde::Serialize;

use crate::Result;
use crate::analysis::iou::{Crop, DEFAULT_BINARISE};
use crate::rng::{Rng, stream};

/// The induction probe: `rows` sequences of `half` random tokens below `vocab`, repeated, after
/// `first` where given.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct InductionProbe {
    pub rows: usize,
    pub half: usize,
    pub vocab: usize,
    pub first: Option<u32>,
    pub seed: u64,
}

impl InductionProbe {
    /// The probe's tokens, `rows` × [`Self::len`], row-major.
    pub fn tokens(&self) -> Vec<u32> {
        let mut rng = stream(self.seed, "induction probe");
        (0..self.rows)
            .flat_map(|_| {
                let random: Vec<u32> = (0..self.half)
                    .map(|_| rng.random_range(0..self.vocab as u32))
                    .collect();
                let first = self.first.into_iter();
                first
                    .chain(random.clone())
                    .chain(random)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Tokens per sequence.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + 2 * self.half
    }

    /// Whether the sequences are empty (no random tokens).
    pub fn is_empty(&self) -> bool {
        self.half == 0
    }

    /// The induction ground truth as an IoU crop: the second copy's queries (o + half + i),
    /// each reading key o + i + 1, over the whole sequence.
    pub fn induction_crop(&self) -> Crop {
        let o = usize::from(self.first.is_some());
        let (len, queries) = (self.len(), o + self.half..self.len());
        let mut truth = vec![0.0; queries.len() * len];
        for (row, q) in queries.clone().enumerate() {
            truth[row * len + q - self.half + 1] = 1.0;
        }
        Crop {
            query_positions: queries.collect(),
            context: len,
            truth,
        }
    }

    /// The probe in words, for captions.
    pub fn describe(&self) -> String {
        let first = match self.first {
            Some(id) => format!(" after token {id}"),
            None => String::new(),
        };
        format!(
            "{} sequences of {} random tokens repeated{first} (seed {}); TransformerLens's \
             definitions",
            self.rows, self.half, self.seed
        )
    }
}

/// One head's scores.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeadScores {
    pub layer: usize,
    pub head: usize,
    /// NaN on an input other than the induction probe (JSON: null), as are the IoUs.
    pub induction: f64,
    /// Hard IoU (τ 0.1) of the second copy's rows against the induction targets.
    pub induction_iou: f64,
    /// Soft IoU (Σmin/Σmax) of the same rows.
    pub induction_soft_iou: f64,
    pub previous_token: f64,
    pub first_token: f64,
    /// Nats.
    pub entropy: f64,
}

/// The scores of every head of one layer's attention `weights` (B, H, T, T): on the induction
/// probe when `probe` is given, else on any input (a text), without the induction score.
pub fn head_scores(
    weights: &Tensor,
    layer: usize,
    probe: Option<&InductionProbe>,
) -> Result<Vec<HeadScores>> {
    let (b, h, t, _) = weights.dims4()?;
    let crop = probe.map(InductionProbe::induction_crop);
    let data = weights
        .to_dtype(candle_core::DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?;
    Ok((0..h)
        .map(|head| {
            let at = |row: usize, q: usize, k: usize| data[((row * h + head) * t + q) * t + k];
            // NaN (JSON null) where no query is scored: a one-token text has no previous token.
            let mean = |f: &dyn Fn(usize, usize) -> f64, queries: std::ops::Range<usize>| {
                if b * queries.len() == 0 {
                    return f64::NAN;
                }
                let n = (b * queries.len()) as f64;
                let total: f64 = (0..b)
                    .flat_map(|row| queries.clone().map(move |q| (row, q)))
                    .map(|(row, q)| f(row, q))
                    .sum();
                total / n
            };
            let rest = 1.min(t)..t;
            let entropy = |row: usize, q: usize| {
                -(0..=q)
                    .map(|k| at(row, q, k))
                    .filter(|&a| a > 0.0)
                    .map(|a| a * a.ln())
                    .sum::<f64>()
            };
            let (induction_iou, induction_soft_iou) = match &crop {
                Some(crop) => {
                    let ious = (0..b).map(|row| {
                        let rows = crop.query_positions.iter();
                        let a: Vec<f64> = rows
                            .flat_map(|&q| (0..t).map(move |k| at(row, q, k)))
                            .collect();
                        (crop.hard_iou(&a, DEFAULT_BINARISE), crop.soft_iou(&a))
                    });
                    let (hard, soft) = ious.fold((0.0, 0.0), |(h, s), (a, b)| (h + a, s + b));
                    (hard / b.max(1) as f64, soft / b.max(1) as f64)
                }
                None => (f64::NAN, f64::NAN),
            };
            HeadScores {
                layer,
                head,
                induction_iou,
                induction_soft_iou,
                induction: probe.map_or(f64::NAN, |p| {
                    let stripe = p.half.saturating_sub(1).min(t)..t;
                    mean(&|row, q| at(row, q, q + 1 - p.half), stripe)
                }),
                previous_token: mean(&|row, q| at(row, q, q - 1), rest.clone()),
                first_token: mean(&|row, q| at(row, q, 0), rest.clone()),
                entropy: mean(&entropy, rest),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// (1, 1, T, T) attention with each query's weight 1 on `key(q)`.
    fn one_hot(t: usize, key: impl Fn(usize) -> usize) -> Tensor {
        let mut data = vec![0f32; t * t];
        for q in 0..t {
            data[q * t + key(q)] = 1.0;
        }
        Tensor::from_vec(data, (1, 1, t, t), &Device::Cpu).unwrap()
    }

    fn probe(first: Option<u32>) -> InductionProbe {
        InductionProbe {
            rows: 1,
            half: 5,
            vocab: 10,
            first,
            seed: 0,
        }
    }

    /// A previous-token head scores 1 there and 0 as an induction head; an induction head the
    /// reverse; a head on the first token is all sink, with zero entropy; uniform rows have
    /// the mean of ln(q + 1).
    #[test]
    fn each_pattern_scores_one_on_its_own_score() {
        let p = probe(Some(7));
        let t = p.len();
        let previous = &head_scores(&one_hot(t, |q| q.saturating_sub(1)), 0, Some(&p)).unwrap()[0];
        assert_eq!((previous.previous_token, previous.induction), (1.0, 0.0));
        // Query 1 + 5 + i reads key 1 + i + 1, the token after the earlier copy; queries 4
        // and 5 (before the second copy) read key 0. TransformerLens's stripe takes queries
        // 4..11 with keys 0..7: 1 at query 4 (its key is 0), 0 at 5, 1 at the five others.
        let induction = |q: usize| if q >= 6 { q + 1 - 5 } else { 0 };
        let induction = &head_scores(&one_hot(t, induction), 1, Some(&p)).unwrap()[0];
        assert_eq!((induction.induction, induction.layer), (6.0 / 7.0, 1));
        // The second copy's five queries all read their targets: IoU 1, hard and soft; the
        // previous-token head reads none of them.
        let ious = (induction.induction_iou, induction.induction_soft_iou);
        assert_eq!(ious, (1.0, 1.0));
        assert_eq!(previous.induction_iou, 0.0);
        assert!(induction.previous_token < 0.2);
        let sink = &head_scores(&one_hot(t, |_| 0), 0, Some(&p)).unwrap()[0];
        assert_eq!((sink.first_token, sink.entropy), (1.0, 0.0));
        // On any other input (a text) the same scores, without induction.
        let text = &head_scores(&one_hot(t, |_| 0), 0, None).unwrap()[0];
        assert!(text.induction.is_nan());
        assert_eq!((text.first_token, text.entropy), (1.0, 0.0));
        let uniform: Vec<f32> = (0..t)
            .flat_map(|q| (0..t).map(move |k| if k <= q { 1.0 / (q + 1) as f32 } else { 0.0 }))
            .collect();
        let uniform = Tensor::from_vec(uniform, (1, 1, t, t), &Device::Cpu).unwrap();
        let expected = (1..t).map(|q| ((q + 1) as f64).ln()).sum::<f64>() / (t - 1) as f64;
        let entropy = head_scores(&uniform, 0, Some(&p)).unwrap()[0].entropy;
        assert!(
            (entropy - expected).abs() < 1e-5,
            "{entropy} against {expected}"
        );
    }

    /// The probe repeats its random half after the first token, and draws the same tokens
    /// from the same seed.
    #[test]
    fn the_probe_repeats_its_tokens_after_the_first() {
        let p = InductionProbe {
            rows: 2,
            ..probe(Some(7))
        };
        let tokens = p.tokens();
        assert_eq!(tokens.len(), 2 * 11);
        for row in tokens.chunks(11) {
            assert_eq!(row[0], 7);
            assert_eq!(row[1..6], row[6..11]);
            assert!(row.iter().all(|&id| id < 10 || id == 7));
        }
        assert_ne!(tokens[1..6], tokens[12..17], "rows differ");
        assert_eq!(tokens, p.tokens());
        assert_eq!(probe(None).len(), 10);
    }
}
