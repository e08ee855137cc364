//! IoU of attention against the MQAR ground truth (ReBased paper, §5 and Table 5).
//!
//! The paper measures "the IoU between the attention matrix and the true positions of the
//! tokens to be retrieved" over 10,000 examples, on the attention cropped to where the pairs
//! are stored, and leaves the rest open. attnlab's protocol, written on every table and figure
//! through [`IouProtocol::describe`]:
//! - **Ground truth.** For the query of key i, the position the model must copy from: the value
//!   token `2i + 1` that follows the key in the context (after the previous-token layer its
//!   hidden state carries the key), or with [`Target::Key`] the key token `2i` itself; with
//!   several passes, one position per pass. Taken from the generator's [`QueryTruth`].
//! - **Crop.** Rows: the query positions only (one per pair, the rows that are scored);
//!   columns: the context `0..2·pairs·passes`.
//! - **Hard IoU.** Each cropped row is binarised ([`Binarise`]); the example's IoU is
//!   `|B ∧ G| / |B ∨ G|` pooled over its rows. Top-k keeps every entry tied with the k-th
//!   largest, so the result does not depend on column order, and never keeps a zero weight.
//! - **Soft IoU** (threshold-free): the Ruzicka (fuzzy Jaccard) similarity
//!   `Σ min(A, G) / Σ max(A, G)` over the crop, on the raw weights (not renormalised to the crop).
//! - **Aggregation.** Per layer and head, the mean (and standard deviation) over examples; heads
//!   are never mixed.
//! - **Headline: soft IoU; hard IoU as a curve over τ.** The paper reads IoU where accuracy is
//!   near 1, and there argmax saturates: every mechanism's largest weight sits on the value, so
//!   argmax gives 1.000 to all and cannot rank them (it was attnlab's earlier default). A
//!   threshold keeps every position with a real share of the row, but the ranking it gives
//!   rests on the threshold: on the shipped IoU runs ReBased falls below Based at τ = 0.02 and 0.05 and
//!   reaches softmax at τ = 0.2. So soft IoU, which has no parameter, leads every table and
//!   figure; hard IoU is reported at the protocol's binarisation (default τ = 0.1) and at every
//!   τ of [`THRESHOLD_CURVE`], which the threshold figure draws.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};

use super::trained::TrainedRun;
use crate::attention::{AttentionWeights, Mixing};
use crate::tasks::Row;
pub use crate::tasks::truth::{Crop, Target};
use crate::{Error, Result};

/// How a cropped attention row becomes a set of positions.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Binarise {
    /// The largest weight of the row (top-1).
    Argmax,
    /// The k largest weights of the row.
    TopK(usize),
    /// Every weight strictly above τ.
    Threshold(f64),
}

impl Binarise {
    /// Checks the parameter for rows of `keys` positions; errors say what is allowed.
    pub fn validate(self, keys: usize) -> Result<Self> {
        match self {
            Self::TopK(0) => Err(Error::argument(
                "binarisation",
                self,
                "needs K ≥ 1 in topk:K (topk:1 is argmax)",
            )),
            // As many as a row holds would keep every position (threshold:0, silently), and
            // hard IoU would be the same for every head.
            Self::TopK(k) if k >= keys => Err(Error::argument(
                "binarisation",
                self,
                format!("keeps every one of the {keys} positions of a row: K < {keys}"),
            )),
            Self::Threshold(t) if !(0.0..1.0).contains(&t) => Err(Error::argument(
                "binarisation",
                self,
                "needs 0 ≤ τ < 1 (attention weights lie in [0, 1])",
            )),
            other => Ok(other),
        }
    }

    /// The positions kept in `row`.
    pub fn apply(self, row: &[f64]) -> Vec<bool> {
        let floor = match self {
            Self::Threshold(t) => return row.iter().map(|&a| a > t).collect(),
            Self::Argmax => kth_largest(row, 1),
            Self::TopK(k) => kth_largest(row, k),
        };
        row.iter().map(|&a| a >= floor && a > 0.0).collect()
    }
}

/// The k-th largest value of `row` (its smallest when k exceeds its length).
fn kth_largest(row: &[f64], k: usize) -> f64 {
    let mut sorted = row.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    sorted
        .get(k.min(sorted.len()).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

impl fmt::Display for Binarise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Argmax => write!(f, "argmax"),
            Self::TopK(k) => write!(f, "topk:{k}"),
            Self::Threshold(t) => write!(f, "threshold:{t}"),
        }
    }
}

impl FromStr for Binarise {
    type Err = Error;

    /// `argmax`, `topk:K` or `threshold:T`.
    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::argument(
                "binarisation",
                format!("'{text}'"),
                "is not argmax, topk:K (K ≥ 1) or threshold:T (0 ≤ T < 1)",
            )
        };
        let parsed = match text.split_once(':') {
            None if text == "argmax" => Self::Argmax,
            Some(("topk", k)) => Self::TopK(k.parse().map_err(|_| bad())?),
            Some(("threshold", t)) => Self::Threshold(t.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        parsed.validate(usize::MAX)
    }
}

/// Everything that decides an IoU number.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IouProtocol {
    pub binarise: Binarise,
    pub target: Target,
    /// Test rows averaged over (the paper uses 10,000).
    pub examples: usize,
    /// Rows read as |A| scaled to sum 1: set from a run whose mechanism mixes with a signed
    /// matrix (retention), whose rows are not distributions; the threshold and the soft IoU
    /// assume non-negative rows.
    #[serde(default)]
    pub magnitudes: bool,
}

/// The default hard binarisation (see the module docs).
pub const DEFAULT_BINARISE: Binarise = Binarise::Threshold(0.1);

/// The thresholds τ at which hard IoU is also reported (the curve over τ), from where a row's
/// every small weight counts to where only a dominant one does.
pub const THRESHOLD_CURVE: [f64; 8] = [0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7];

impl Default for IouProtocol {
    fn default() -> Self {
        Self {
            binarise: DEFAULT_BINARISE,
            target: Target::Value,
            examples: 10_000,
            magnitudes: false,
        }
    }
}

impl IouProtocol {
    /// One line for captions and table headers.
    pub fn describe(&self) -> String {
        format!("{}; mean over {} test rows", self.scoring(), self.examples)
    }

    /// How one example is scored: target, crop and binarisation.
    pub fn scoring(&self) -> String {
        let rows = match self.magnitudes {
            true => "|A| of the signed matrix, L1-row-normalised",
            false => "queries",
        };
        format!(
            "IoU vs MQAR ground truth ({} position); rows: {rows}, columns: context; hard: {} \
             per row, pooled over the example's queries; soft: Σmin/Σmax",
            self.target.name(),
            self.binarise
        )
    }

    /// The protocol as it applies to `run`: magnitudes for a signed mixing matrix.
    fn for_run(&self, run: &TrainedRun) -> Self {
        Self {
            magnitudes: run.preset.attention.mixing() == Mixing::Signed,
            ..*self
        }
    }

    /// The weights as this protocol reads them.
    fn read<'a>(&self, weights: &'a AttentionWeights) -> Cow<'a, AttentionWeights> {
        match self.magnitudes {
            true => Cow::Owned(weights.magnitudes()),
            false => Cow::Borrowed(weights),
        }
    }
}

/// The hard IoU lives here, beside the binarisations it takes; the crop and its soft IoU are
/// the task's ([`crate::tasks::truth`]), which training's TensorBoard sink reads too.
impl Crop {
    /// Hard IoU of cropped attention `a`: `|B ∧ G| / |B ∨ G|` pooled over the rows.
    pub fn hard_iou(&self, a: &[f64], binarise: Binarise) -> f64 {
        let (mut both, mut either) = (0usize, 0usize);
        for (row, truth) in a.chunks(self.context).zip(self.truth.chunks(self.context)) {
            for (b, &g) in binarise.apply(row).into_iter().zip(truth) {
                let g = g > 0.5;
                both += usize::from(b && g);
                either += usize::from(b || g);
            }
        }
        if either == 0 {
            0.0
        } else {
            both as f64 / either as f64
        }
    }
}

/// Mean and standard deviation (over examples) of one layer and head.
#[derive(Clone, Copy, Debug, Default)]
struct Moments {
    n: f64,
    sum: f64,
    sum_sq: f64,
}

impl Moments {
    fn add(&mut self, x: f64) {
        self.n += 1.0;
        self.sum += x;
        self.sum_sq += x * x;
    }

    fn mean(&self) -> f64 {
        self.sum / self.n.max(1.0)
    }

    /// Population standard deviation.
    fn std(&self) -> f64 {
        (self.sum_sq / self.n.max(1.0) - self.mean().powi(2))
            .max(0.0)
            .sqrt()
    }
}

/// IoU per attention layer and head of one run: the paper's Table 5, one row per head.
#[derive(Clone, Debug, Serialize)]
pub struct IouTable {
    pub protocol: IouProtocol,
    /// Test rows averaged over: `protocol.examples`, kept at the top of the JSON as
    /// docs/recall.md documents it.
    pub examples: usize,
    pub mechanism: String,
    /// Model layer of each table row (attention layers only).
    pub layers: Vec<usize>,
    /// Mean hard IoU, `[layer][head]`.
    pub hard: Vec<Vec<f64>>,
    /// Mean soft IoU, `[layer][head]`.
    pub soft: Vec<Vec<f64>>,
    /// Standard deviations over examples, `[layer][head]`.
    pub hard_std: Vec<Vec<f64>>,
    pub soft_std: Vec<Vec<f64>>,
    /// Mean hard IoU with `threshold:τ` for each τ of [`THRESHOLD_CURVE`],
    /// `[τ][layer][head]`.
    pub hard_by_threshold: Vec<Vec<Vec<f64>>>,
}

/// One cell of an [`IouTable`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct IouCell {
    /// Model layer.
    pub layer: usize,
    pub head: usize,
    pub hard: f64,
    pub soft: f64,
    pub hard_std: f64,
    pub soft_std: f64,
}

impl IouTable {
    /// Hard IoU of `cell` (one of [`Self::cells`]) at each τ of [`THRESHOLD_CURVE`].
    pub fn hard_curve(&self, cell: &IouCell) -> Vec<f64> {
        let l = self
            .layers
            .iter()
            .position(|&l| l == cell.layer)
            .unwrap_or(0);
        self.hard_by_threshold
            .iter()
            .map(|v| v[l][cell.head])
            .collect()
    }

    /// Every layer and head, layer by layer.
    pub fn cells(&self) -> impl Iterator<Item = IouCell> + '_ {
        self.layers.iter().enumerate().flat_map(move |(l, &layer)| {
            (0..self.hard[l].len()).map(move |head| IouCell {
                layer,
                head,
                hard: self.hard[l][head],
                soft: self.soft[l][head],
                hard_std: self.hard_std[l][head],
                soft_std: self.soft_std[l][head],
            })
        })
    }
}

/// An error unless `attention` is over the sequence's own tokens (Linformer's is not).
fn check_token_columns(run: &TrainedRun, attention: &AttentionWeights) -> Result<()> {
    let [_, _, tq, tk] = attention.shape;
    if tk == tq {
        return Ok(());
    }
    Err(Error::RunDir {
        message: format!(
            "{} attends over {tk} projected positions, not over the {tq} tokens, so its \
             attention cannot be compared with ground-truth token positions",
            run.preset.attention.name()
        ),
        path: run.run.path().to_path_buf(),
    })
}

/// IoU of every attention layer and head of `run` over its first `protocol.examples` test rows.
/// Returns `Ok(None)` when `cancel` was set.
pub fn run_iou(
    run: &TrainedRun,
    protocol: &IouProtocol,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Option<IouTable>> {
    let protocol = &protocol.for_run(run);
    if protocol.examples == 0 {
        return Err(Error::argument(
            "examples (--examples)",
            0,
            "are too few: IoU needs at least 1 example",
        ));
    }
    let context = run.context_len()?;
    protocol.binarise.validate(context)?;
    let layers = run.attention_layers();
    let heads = run.preset.model.n_heads;
    let mut hard = vec![vec![Moments::default(); heads]; layers.len()];
    let mut soft = hard.clone();
    let mut curve = vec![hard.clone(); THRESHOLD_CURVE.len()];
    let examples = run.test_examples(protocol.examples)?;
    let finished = run.for_each_batch(&examples, progress, cancel, &mut |batch, attention| {
        for (l, &layer) in layers.iter().enumerate() {
            let Some(weights) = &attention[layer] else {
                continue;
            };
            check_token_columns(run, weights)?;
            let mut curve: Vec<&mut [Moments]> = curve.iter_mut().map(|c| &mut c[l][..]).collect();
            let scores = Scores {
                hard: &mut hard[l],
                soft: &mut soft[l],
                curve: &mut curve,
            };
            score_batch(batch, &protocol.read(weights), context, protocol, scores);
        }
        Ok(())
    })?;
    if !finished {
        return Ok(None);
    }
    let table = |m: &[Vec<Moments>], f: fn(&Moments) -> f64| -> Vec<Vec<f64>> {
        m.iter().map(|row| row.iter().map(f).collect()).collect()
    };
    Ok(Some(IouTable {
        // The rows there were: a run on mad-lab's published data may hold fewer than asked.
        protocol: IouProtocol {
            examples: examples.len(),
            ..*protocol
        },
        examples: examples.len(),
        mechanism: run.preset.attention.name().into(),
        layers,
        hard: table(&hard, Moments::mean),
        soft: table(&soft, Moments::mean),
        hard_std: table(&hard, Moments::std),
        soft_std: table(&soft, Moments::std),
        hard_by_threshold: curve.iter().map(|c| table(c, Moments::mean)).collect(),
    }))
}

/// One layer's running scores, per head: hard IoU at the protocol's binarisation, soft IoU,
/// and hard IoU at each τ of [`THRESHOLD_CURVE`].
struct Scores<'a, 'b> {
    hard: &'a mut [Moments],
    soft: &'a mut [Moments],
    curve: &'a mut [&'b mut [Moments]],
}

/// Adds the IoU of every example of a batch and every head of one layer.
fn score_batch(
    batch: &[Row],
    weights: &AttentionWeights,
    context: usize,
    protocol: &IouProtocol,
    scores: Scores,
) {
    let tk = weights.shape[3];
    for (b, example) in batch.iter().enumerate() {
        let crop = Crop::new(&example.queries, context, protocol.target);
        for h in 0..scores.hard.len() {
            let a = crop.of(weights.matrix(b, h), tk);
            let by_threshold: Vec<f64> = THRESHOLD_CURVE
                .iter()
                .map(|&tau| crop.hard_iou(&a, Binarise::Threshold(tau)))
                .collect();
            // The protocol's τ is usually one of the curve's (0.1 by default): read it there.
            let on_curve = THRESHOLD_CURVE
                .iter()
                .position(|&tau| protocol.binarise == Binarise::Threshold(tau));
            let hard = match on_curve {
                Some(i) => by_threshold[i],
                None => crop.hard_iou(&a, protocol.binarise),
            };
            scores.hard[h].add(hard);
            scores.soft[h].add(crop.soft_iou(&a));
            for (curve, iou) in scores.curve.iter_mut().zip(by_threshold) {
                curve[h].add(iou);
            }
        }
    }
}

/// One example as the example view shows it: the model's cropped attention beside the ground
/// truth, with that example's IoU.
#[derive(Clone, Debug, Serialize)]
pub struct ExampleIou {
    pub protocol: IouProtocol,
    /// Index of the row in the test split.
    pub row: usize,
    pub layer: usize,
    pub head: usize,
    pub crop: Crop,
    /// The model's cropped attention, row-major `queries × context`.
    pub attention: Vec<f64>,
    /// The binarised attention the hard IoU used, 0 or 1, same layout.
    pub binarised: Vec<f64>,
    pub hard: f64,
    pub soft: f64,
}

/// The IoU of test row `row` for model layer `layer` and head `head` of `run`.
pub fn example_iou(
    run: &TrainedRun,
    row: usize,
    layer: usize,
    head: usize,
    protocol: &IouProtocol,
) -> Result<ExampleIou> {
    protocol.binarise.validate(run.context_len()?)?;
    let layers = run.attention_layers();
    if !layers.contains(&layer) {
        return Err(Error::argument(
            "layer",
            layer,
            format!("has no attention; attention layers: {layers:?}"),
        ));
    }
    let heads = run.preset.model.n_heads;
    if head >= heads {
        return Err(Error::argument(
            "head",
            head,
            format!("does not exist: heads are 0..{heads}"),
        ));
    }
    let last = super::trained::MAX_TEST_ROWS - 1;
    if row > last {
        return Err(Error::argument(
            "test row",
            row,
            format!("is past the last row an analysis generates, {last}"),
        ));
    }
    let mut rows = run.test_examples(row + 1)?;
    if row >= rows.len() {
        return Err(Error::argument(
            "test row",
            row,
            format!(
                "is past the run's test rows: its data holds {} (0..{})",
                rows.len(),
                rows.len()
            ),
        ));
    }
    let example = rows.swap_remove(row);
    let attention = run.attention(&[&example.inputs])?;
    let weights = attention[layer]
        .as_ref()
        .ok_or_else(|| Error::Internal(format!("attention layer {layer} returned no weights")))?;
    check_token_columns(run, weights)?;
    let protocol = &protocol.for_run(run);
    let weights = protocol.read(weights);
    let crop = Crop::new(&example.queries, run.context_len()?, protocol.target);
    let a = crop.of(weights.matrix(0, head), weights.shape[3]);
    let binarised = a
        .chunks(crop.context)
        .flat_map(|r| protocol.binarise.apply(r))
        .map(|b| f64::from(u8::from(b)))
        .collect();
    Ok(ExampleIou {
        protocol: *protocol,
        row,
        layer,
        head,
        hard: crop.hard_iou(&a, protocol.binarise),
        soft: crop.soft_iou(&a),
        attention: a,
        binarised,
        crop,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::Split;
    use crate::tasks::mqar::{MqarConfig, QueryTruth, layout};

    /// An example of 4 pairs in 24 tokens (context 8, queries at 8..24 on even offsets).
    fn example() -> Row {
        layout(&[1, 2, 3, 4], &[9, 10, 11, 12], &[3, 0, 5, 1], 1, 24)
    }

    /// The full T × T matrix with `row_of(query position)` on every query row, zeros elsewhere.
    fn full_matrix(ex: &Row, row_of: impl Fn(&QueryTruth) -> Vec<f32>) -> Vec<f32> {
        let t = ex.inputs.len();
        let mut m = vec![0f32; t * t];
        for q in &ex.queries {
            m[q.position * t..(q.position + 1) * t].copy_from_slice(&row_of(q));
        }
        m
    }

    const ALL: [Binarise; 5] = [
        Binarise::Argmax,
        Binarise::TopK(1),
        Binarise::TopK(3),
        Binarise::Threshold(0.0),
        Binarise::Threshold(0.5),
    ];

    #[test]
    fn perfect_attention_scores_one() {
        let ex = example();
        for target in [Target::Value, Target::Key] {
            let crop = Crop::new(&ex.queries, 8, target);
            let m = full_matrix(&ex, |q| {
                let mut row = vec![0f32; 24];
                row[target.positions(q)[0]] = 1.0;
                row
            });
            let a = crop.of(&m, 24);
            for how in ALL {
                assert_eq!(crop.hard_iou(&a, how), 1.0, "{how} {target:?}");
            }
            assert_eq!(crop.soft_iou(&a), 1.0);
        }
    }

    #[test]
    fn causal_uniform_attention_scores_the_known_values() {
        // Row p spreads 1/(p+1) over positions 0..=p; all 8 context columns are tied, so every
        // top-k keeps all of them: |B ∧ G| = 1 and |B ∨ G| = 8 per row, IoU = 1/8.
        let ex = example();
        let crop = Crop::new(&ex.queries, 8, Target::Value);
        let m = full_matrix(&ex, |q| {
            let w = 1.0 / (q.position + 1) as f32;
            (0..24)
                .map(|j| if j <= q.position { w } else { 0.0 })
                .collect()
        });
        let a = crop.of(&m, 24);
        for how in [
            Binarise::Argmax,
            Binarise::TopK(2),
            Binarise::Threshold(0.01),
        ] {
            assert!((crop.hard_iou(&a, how) - 1.0 / 8.0).abs() < 1e-12, "{how}");
        }
        // Above every weight (the largest is 1/9 at position 8): nothing kept, IoU = 0/4.
        assert_eq!(crop.hard_iou(&a, Binarise::Threshold(0.2)), 0.0);
        // Soft: Σ_G A / (|G| + Σ_¬G A) = Σ w_r / (4 + 7 Σ w_r), w_r = 1/(p_r + 1).
        let w: f64 = ex
            .queries
            .iter()
            .map(|q| 1.0 / (q.position + 1) as f64)
            .map(|w| w as f32 as f64)
            .sum();
        let want = w / (4.0 + 7.0 * w);
        assert!((crop.soft_iou(&a) - want).abs() < 1e-9);
    }

    #[test]
    fn uniform_over_the_crop_gives_one_over_c_and_one_over_2c_minus_1() {
        let ex = example();
        let crop = Crop::new(&ex.queries, 8, Target::Key);
        let a = vec![1.0 / 8.0; 4 * 8];
        for how in [
            Binarise::Argmax,
            Binarise::TopK(5),
            Binarise::Threshold(0.1),
        ] {
            assert!((crop.hard_iou(&a, how) - 0.125).abs() < 1e-12, "{how}");
        }
        assert!((crop.soft_iou(&a) - 1.0 / 15.0).abs() < 1e-12);
    }

    #[test]
    fn topk_counts_extra_positions_against_the_score() {
        // Weight on the value and, less, on the key: top-2 keeps both, IoU = 1/2 per row.
        let ex = example();
        let crop = Crop::new(&ex.queries, 8, Target::Value);
        let m = full_matrix(&ex, |q| {
            let mut row = vec![0f32; 24];
            row[q.value_positions[0]] = 0.7;
            row[q.key_positions[0]] = 0.3;
            row
        });
        let a = crop.of(&m, 24);
        assert_eq!(crop.hard_iou(&a, Binarise::Argmax), 1.0);
        assert_eq!(crop.hard_iou(&a, Binarise::TopK(2)), 0.5);
        assert_eq!(crop.hard_iou(&a, Binarise::Threshold(0.5)), 1.0);
        // Soft: Σmin = 4·0.7, Σmax = 4·(1 + 0.3).
        assert!((crop.soft_iou(&a) - 0.7 / 1.3).abs() < 1e-6);
    }

    #[test]
    fn ground_truth_is_the_generators() {
        let config = MqarConfig {
            vocab_size: 256,
            seq_len: 128,
            num_kv_pairs: 32,
            ..MqarConfig::default()
        };
        for ex in config.examples(Split::Test, 20) {
            let crop = Crop::new(&ex.queries, 64, Target::Value);
            assert_eq!(crop.query_positions.len(), 32);
            for (r, &p) in crop.query_positions.iter().enumerate() {
                let row = &crop.truth[r * 64..(r + 1) * 64];
                let c = row.iter().position(|&g| g == 1.0).unwrap();
                assert_eq!(row.iter().sum::<f64>(), 1.0);
                // The query repeats the key just before column c, and its label is the token at c.
                assert_eq!(ex.inputs[p], ex.inputs[c - 1]);
                assert_eq!(ex.labels[p], ex.inputs[c] as i32);
                assert_eq!(c % 2, 1);
            }
        }
    }

    #[test]
    fn binarisations_parse_print_and_validate() {
        for text in ["argmax", "topk:3", "threshold:0.25"] {
            assert_eq!(text.parse::<Binarise>().unwrap().to_string(), text);
        }
        for bad in ["top", "topk:0", "topk:x", "threshold:1", "threshold:-0.1"] {
            assert!(bad.parse::<Binarise>().is_err(), "{bad}");
        }
        // A K of a row's keys or more would keep every position: refused where the length
        // is known.
        assert!(Binarise::TopK(63).validate(64).is_ok());
        for k in [64, 65] {
            let err = Binarise::TopK(k).validate(64).unwrap_err().to_string();
            assert!(
                err.contains(&format!("topk:{k}")) && err.contains("K < 64"),
                "{err}"
            );
        }
    }
}
