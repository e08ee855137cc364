//! Multi-query associative recall (MQAR), a port of zoology's `multiquery_ar`
//! (HazyResearch/zoology, `zoology/data/multiquery_ar.py`; Arora et al. 2023, arXiv 2312.04927).
//!
//! Each row holds `N` key–value pairs, then a query region in which every key appears once
//! more; at each query the model must predict the value that followed that key. With
//! vocabulary 12, 2 pairs and length 16 (zoology's docstring example), keys (2, 4), values
//! (8, 7) and query gaps (4, 1):
//!
//! ```text
//! inputs: 2 8 4 7 0 0 4 0 0 0 0 0 2 0 0 0
//! labels: - - - - - - 7 - - - - - 8 - - -      (- is IGNORE = -100)
//! ```
//!
//! Exactly as zoology: keys come from `[1, V/2)`, values from `[V/2, V)`, both distinct within
//! a row; token 0 is the filler; the context `k1 v1 k2 v2 …` is repeated `num_passes` times;
//! query gaps follow the power law `p(g) ∝ a·(g+1)^(a−1)` (`a = power_a`), drawn without
//! replacement, and key i is queried at offset `2·gap_i` of the query region; the target sits
//! at the query's own position (next-token prediction); optional random filler tokens.
//! The test split uses `seed + 10`, as the ReBased code does, unless `test_seed` is given.
//! Random numbers come from attnlab's own seeded generator, so rows are reproducible but not
//! bit-identical to NumPy's.

use serde::{Deserialize, Serialize};

use super::{Dataset, IGNORE, Row, Split, check_split_size};
use crate::rng::{self, AttnRng, Rng};
use crate::{Error, Result};

/// The longest MQAR row: as language modelling's, far past what attention over every pair of
/// positions trains on in memory.
pub const MAX_SEQ_LEN: usize = 65_536;

/// The largest MQAR vocabulary: tokens are `u32`s, every row draws from a pool of half the
/// vocabulary, and the embedding grows with it (zoology's largest is 8,192).
pub const MAX_VOCAB: usize = 65_536;

/// MQAR settings (the `[task]` section with `kind = "mqar"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqarConfig {
    pub vocab_size: usize,
    pub seq_len: usize,
    pub num_kv_pairs: usize,
    /// Exponent `a` of the query-gap power law; small values favour queries right after the context.
    pub power_a: f64,
    /// Replace filler zeros by uniform random tokens (zoology's default; the ReBased configs turn it off).
    pub random_non_queries: bool,
    /// How many times the key–value context is repeated before the queries.
    pub num_passes: usize,
    pub train_examples: usize,
    pub test_examples: usize,
    pub seed: u64,
    /// Seed of the test split; `seed + 10` when absent.
    pub test_seed: Option<u64>,
}

static FACTS: super::TaskFacts = super::TaskFacts {
    name: "mqar",
    summary: "multi-query associative recall: N key-value pairs, then each key again; predict \
              its value",
    paper: "Arora et al. 2023 (Zoology, arXiv 2312.04927); zoology's multiquery_ar",
    needs_causal: false,
    default: || super::TaskSpec::Mqar(MqarConfig::default()),
};

impl super::Listed for MqarConfig {
    const FACTS: &'static super::TaskFacts = &FACTS;
}

impl super::Task for MqarConfig {
    super::sizes_from_fields!();

    fn validate(&self) -> Result<()> {
        MqarConfig::validate(self)
    }

    fn datasets(&self) -> Result<(Dataset, Dataset)> {
        Ok((self.generate(Split::Train), self.generate(Split::Test)))
    }

    /// Its queries: one per pair.
    fn scored_per_row(&self) -> usize {
        self.num_kv_pairs
    }

    /// The ground truth of every query: a [`QueryTruth`] is its position, key, value and two
    /// Vecs of one entry per pass.
    fn extra_data_bytes(&self) -> f64 {
        let rows = self.train_examples as f64 + self.test_examples as f64;
        let truth = 40.0 + 2.0 * (24.0 + 8.0 * self.num_passes as f64);
        rows * (24.0 + self.num_kv_pairs as f64 * truth)
    }

    fn truth_context(&self) -> Option<usize> {
        Some(self.context_len())
    }

    fn rows(&self, split: Split, n: usize) -> Result<Vec<Row>> {
        Ok(self.examples(split, n))
    }
}

impl Default for MqarConfig {
    fn default() -> Self {
        Self {
            vocab_size: 256,
            seq_len: 64,
            num_kv_pairs: 4,
            power_a: 0.01,
            random_non_queries: false,
            num_passes: 1,
            train_examples: 10_000,
            test_examples: 1_000,
            seed: 0,
            test_seed: None,
        }
    }
}

/// Ground truth of one query: where it is and where the model must look.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryTruth {
    /// Position of the query token (its label is the value).
    pub position: usize,
    pub key: u32,
    pub value: u32,
    /// Positions of the matching key in the context (one per pass).
    pub key_positions: Vec<usize>,
    /// Positions of the matching value in the context (one per pass).
    pub value_positions: Vec<usize>,
}

impl MqarConfig {
    /// Saturating, so a preset with absurd counts reaches [`Self::validate`]'s message
    /// instead of an overflow.
    fn context_len(&self) -> usize {
        self.num_kv_pairs
            .saturating_mul(self.num_passes)
            .saturating_mul(2)
    }

    /// Number of even slots in the query region (zoology's `space`).
    fn gap_space(&self) -> usize {
        self.seq_len.saturating_sub(self.context_len()) / 2
    }

    /// zoology's checks, as preset errors naming the key.
    pub fn validate(&self) -> Result<()> {
        let err = |key: &str, value: &dyn ToString, why: &str| {
            Err(Error::preset(format!("task.{key}"), value.to_string(), why))
        };
        if !(4..=MAX_SEQ_LEN).contains(&self.seq_len) || !self.seq_len.is_multiple_of(2) {
            return err(
                "seq_len",
                &self.seq_len,
                &format!("must be an even number in 4..={MAX_SEQ_LEN}"),
            );
        }
        if self.vocab_size <= self.seq_len || self.vocab_size > MAX_VOCAB {
            return err(
                "vocab_size",
                &self.vocab_size,
                &format!(
                    "must be larger than task.seq_len = {} and at most {MAX_VOCAB}",
                    self.seq_len
                ),
            );
        }
        if self.num_kv_pairs == 0 || self.num_kv_pairs >= self.vocab_size / 2 {
            return err(
                "num_kv_pairs",
                &self.num_kv_pairs,
                &format!(
                    "must be in 1..{} (keys are drawn from [1, vocab_size/2))",
                    self.vocab_size / 2
                ),
            );
        }
        if self.num_passes == 0 {
            return err("num_passes", &self.num_passes, "must be ≥ 1");
        }
        if self.context_len().saturating_add(2 * self.num_kv_pairs) > self.seq_len {
            let (key, value) = match self.num_passes {
                1 => ("num_kv_pairs", self.num_kv_pairs),
                passes => ("num_passes", passes),
            };
            return err(
                key,
                &value,
                &format!(
                    "too many for seq_len = {}: need 2·pairs·passes + 2·pairs ≤ seq_len",
                    self.seq_len
                ),
            );
        }
        if !(self.power_a > 0.0 && self.power_a.is_finite()) {
            return err(
                "power_a",
                &crate::error::number(self.power_a),
                "must be a positive number (zoology uses 0.01)",
            );
        }
        if self.train_examples == 0 {
            return err("train_examples", &self.train_examples, "must be ≥ 1");
        }
        if self.test_examples == 0 {
            return err("test_examples", &self.test_examples, "must be ≥ 1");
        }
        check_split_size("train_examples", self.train_examples, self.seq_len)?;
        check_split_size("test_examples", self.test_examples, self.seq_len)
    }

    /// The seed of `split`.
    pub fn split_seed(&self, split: Split) -> u64 {
        match split {
            Split::Train => self.seed,
            Split::Test => self.test_seed.unwrap_or(self.seed.wrapping_add(10)),
        }
    }

    /// The first `n` rows of `split` (the same rows `generate` puts first).
    pub fn examples(&self, split: Split, n: usize) -> Vec<Row> {
        let mut rng = rng::stream(self.split_seed(split), "mqar");
        let weights = self.gap_weights();
        (0..n).map(|_| self.example(&mut rng, &weights)).collect()
    }

    /// The whole split as a dataset.
    pub fn generate(&self, split: Split) -> Dataset {
        let n = match split {
            Split::Train => self.train_examples,
            Split::Test => self.test_examples,
        };
        Dataset::of_rows(self.seq_len, self.examples(split, n))
    }

    /// `p(g) ∝ a·(g+1)^(a−1)` for g = 0..space (unnormalised; the sampler does not need the sum).
    fn gap_weights(&self) -> Vec<f64> {
        let a = self.power_a;
        (1..=self.gap_space())
            .map(|g| a * (g as f64).powf(a - 1.0))
            .collect()
    }

    fn example(&self, rng: &mut AttnRng, gap_weights: &[f64]) -> Row {
        let n = self.num_kv_pairs;
        let half = (self.vocab_size / 2) as u32;
        let keys = distinct(rng, 1..half, n);
        let values = distinct(rng, half..self.vocab_size as u32, n);
        let gaps = weighted_without_replacement(rng, gap_weights, n);
        let mut example = layout(&keys, &values, &gaps, self.num_passes, self.seq_len);
        if self.random_non_queries {
            for token in example.inputs.iter_mut().filter(|t| **t == 0) {
                *token = rng.random_range(0..self.vocab_size as u32);
            }
        }
        example
    }
}

/// The deterministic part of the generator: places given keys, values and gaps.
pub fn layout(keys: &[u32], values: &[u32], gaps: &[usize], passes: usize, seq_len: usize) -> Row {
    let n = keys.len();
    let context = 2 * n * passes;
    // zoology builds a row of length seq_len + 1 and shifts: inputs = row[..-1], labels = row[1..].
    let mut row = vec![0u32; seq_len + 1];
    let mut labels = vec![IGNORE; seq_len + 1];
    for pass in 0..passes {
        for i in 0..n {
            row[pass * 2 * n + 2 * i] = keys[i];
            row[pass * 2 * n + 2 * i + 1] = values[i];
        }
    }
    let mut queries = Vec::with_capacity(n);
    for i in 0..n {
        let position = context + 2 * gaps[i];
        row[position] = keys[i];
        labels[position + 1] = values[i] as i32;
        queries.push(QueryTruth {
            position,
            key: keys[i],
            value: values[i],
            key_positions: (0..passes).map(|p| p * 2 * n + 2 * i).collect(),
            value_positions: (0..passes).map(|p| p * 2 * n + 2 * i + 1).collect(),
        });
    }
    queries.sort_by_key(|q| q.position);
    row.pop();
    labels.remove(0);
    Row {
        inputs: row,
        labels,
        queries,
    }
}

/// `n` distinct values from `range`, uniformly (NumPy's `choice(replace=False)`).
fn distinct(rng: &mut AttnRng, range: std::ops::Range<u32>, n: usize) -> Vec<u32> {
    let pool: Vec<u32> = range.collect();
    rand::seq::index::sample(rng, pool.len(), n)
        .into_iter()
        .map(|i| pool[i])
        .collect()
}

/// `n` distinct indices drawn one after another with probability ∝ `weights` among those left,
/// which is the distribution of NumPy's `choice(replace=False, p=…)`. Efraimidis–Spirakis:
/// the `n` largest `ln(u)/w` come out in the order successive sampling would draw them.
fn weighted_without_replacement(rng: &mut AttnRng, weights: &[f64], n: usize) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            (u.ln() / w, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0));
    keyed.into_iter().take(n).map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zoology_docstring_example() {
        let ex = layout(&[2, 4], &[8, 7], &[4, 1], 1, 16);
        assert_eq!(
            ex.inputs,
            vec![2, 8, 4, 7, 0, 0, 4, 0, 0, 0, 0, 0, 2, 0, 0, 0]
        );
        let mut want = vec![IGNORE; 16];
        want[6] = 7;
        want[12] = 8;
        assert_eq!(ex.labels, want);
        assert_eq!(ex.queries[0].position, 6);
        assert_eq!(ex.queries[0].key_positions, vec![2]);
        assert_eq!(ex.queries[0].value_positions, vec![3]);
    }

    fn cfg() -> MqarConfig {
        MqarConfig {
            vocab_size: 64,
            seq_len: 32,
            num_kv_pairs: 4,
            train_examples: 2000,
            test_examples: 10,
            ..MqarConfig::default()
        }
    }

    #[test]
    fn keys_values_and_labels_are_consistent() {
        let c = cfg();
        for ex in c.examples(Split::Train, 500) {
            let keys: Vec<u32> = (0..4).map(|i| ex.inputs[2 * i]).collect();
            let values: Vec<u32> = (0..4).map(|i| ex.inputs[2 * i + 1]).collect();
            assert!(keys.iter().all(|&k| (1..32).contains(&k)));
            assert!(values.iter().all(|&v| (32..64).contains(&v)));
            let mut k = keys.clone();
            k.sort();
            k.dedup();
            assert_eq!(k.len(), 4, "keys distinct");
            let mut v = values.clone();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), 4, "values distinct");
            assert_eq!(ex.labels.iter().filter(|&&l| l != IGNORE).count(), 4);
            for q in &ex.queries {
                assert_eq!(ex.inputs[q.position], q.key);
                assert_eq!(ex.labels[q.position], q.value as i32);
                assert_eq!(ex.inputs[q.key_positions[0]], q.key);
                assert_eq!(ex.inputs[q.value_positions[0]], q.value);
                assert_eq!((q.position - 8) % 2, 0, "queries on even offsets");
            }
        }
    }

    #[test]
    fn gaps_follow_the_power_law() {
        // With one pair, the gap is a single draw from p(g) ∝ (g+1)^(a−1).
        let c = MqarConfig {
            num_kv_pairs: 1,
            ..cfg()
        };
        let space = c.gap_space();
        let weights = c.gap_weights();
        let total: f64 = weights.iter().sum();
        let n = 20_000;
        let mut counts = vec![0usize; space];
        for ex in c.examples(Split::Train, n) {
            counts[(ex.queries[0].position - 2) / 2] += 1;
        }
        for g in [0, 1, 5, space - 1] {
            let expected = weights[g] / total;
            let observed = counts[g] as f64 / n as f64;
            let sd = (expected * (1.0 - expected) / n as f64).sqrt();
            assert!(
                (observed - expected).abs() < 5.0 * sd,
                "gap {g}: observed {observed}, expected {expected}"
            );
        }
    }

    #[test]
    fn splits_differ_and_repeat() {
        let c = cfg();
        assert_eq!(c.examples(Split::Test, 3), c.examples(Split::Test, 3));
        assert_ne!(c.examples(Split::Train, 3), c.examples(Split::Test, 3));
        assert_eq!(c.split_seed(Split::Test), 10);
    }

    #[test]
    fn multiple_passes_repeat_the_context() {
        let c = MqarConfig {
            num_passes: 2,
            ..cfg()
        };
        let ex = &c.examples(Split::Train, 1)[0];
        assert_eq!(&ex.inputs[0..8], &ex.inputs[8..16]);
        assert_eq!(ex.queries[0].key_positions.len(), 2);
    }

    #[test]
    fn random_fillers_replace_zeros() {
        let c = MqarConfig {
            random_non_queries: true,
            ..cfg()
        };
        let zeros: usize = c
            .examples(Split::Train, 50)
            .iter()
            .map(|e| e.inputs.iter().filter(|&&t| t == 0).count())
            .sum();
        assert!(zeros < 50, "fillers were replaced ({zeros} zeros left)");
    }

    #[test]
    fn validation_names_the_key() {
        let bad = MqarConfig {
            num_kv_pairs: 20,
            ..cfg()
        };
        let msg = bad.validate().unwrap_err().to_string();
        assert!(msg.contains("task.num_kv_pairs = 20"), "{msg}");
        assert!(cfg().validate().is_ok());
    }

    /// Sizes whose products overflow or ask for terabytes are refused by validation, naming
    /// the key, before any row is generated (they used to panic or abort in `generate`).
    #[test]
    fn absurd_sizes_are_refused_naming_the_key() {
        let cases = [
            (
                MqarConfig {
                    num_passes: 1 << 61,
                    ..cfg()
                },
                "task.num_passes = 2305843009213693952",
            ),
            (
                MqarConfig {
                    train_examples: 1_000_000_000_000,
                    ..cfg()
                },
                "task.train_examples = 1000000000000",
            ),
            (
                MqarConfig {
                    test_examples: usize::MAX,
                    ..cfg()
                },
                "task.test_examples",
            ),
            (
                MqarConfig {
                    vocab_size: (1 << 32) + 2,
                    ..cfg()
                },
                "task.vocab_size = 4294967298",
            ),
            (
                MqarConfig {
                    seq_len: 1_000_000,
                    vocab_size: 2_000_000,
                    ..cfg()
                },
                "task.seq_len = 1000000",
            ),
        ];
        for (config, key) in cases {
            let msg = config.validate().unwrap_err().to_string();
            assert!(msg.contains(key), "{msg}");
        }
    }

    /// The largest seed still has a test split (`seed + 10` wraps instead of overflowing).
    #[test]
    fn the_largest_seed_has_a_test_seed() {
        let c = MqarConfig {
            seed: u64::MAX,
            ..cfg()
        };
        assert_eq!(c.split_seed(Split::Test), 9);
    }
}
