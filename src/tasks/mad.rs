//! MAD's synthetic probes (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid
//! Architectures"; athms/mad-lab `mad/data/instances.py`), ported from the reference code as
//! `../shared/reference/mixers-mad-checkpoints.md` §1.2 reads it line by line:
//! in-context recall, noisy and fuzzy in-context recall, selective copying, compression and
//! memorisation. Each setting left unset takes the probe's MAD baseline.
//!
//! Rows follow MAD's shapes: the recall probes build L tokens and train on the shifted next
//! token everywhere (rows of L − 1 tokens; fuzzy recall left-pads to L + 1 first), scoring
//! only the recalled values at test; selective copying and memorisation score their probes in
//! both splits, unshifted. Labels are attnlab's: `labels[p]` is what the model must output at
//! position p, [`IGNORE`] where nothing is scored. Random numbers come from attnlab's seeded
//! streams (one per split, and one for memorisation's map, shared by both splits), so rows are
//! reproducible but not NumPy's; selective copying's blanks, which MAD draws from NumPy's
//! unseeded global generator, are seeded here.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::mqar::QueryTruth;
use super::{Dataset, IGNORE, Row, Split, check_split_size};
use crate::rng::{self, AttnRng, IndexedRandom, Rng, SliceRandom};
use crate::{Error, Result};

/// The six probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Probe {
    #[default]
    InContextRecall,
    NoisyInContextRecall,
    FuzzyInContextRecall,
    SelectiveCopying,
    Compression,
    Memorization,
}

impl Probe {
    pub const ALL: [Probe; 6] = [
        Probe::InContextRecall,
        Probe::NoisyInContextRecall,
        Probe::FuzzyInContextRecall,
        Probe::SelectiveCopying,
        Probe::Compression,
        Probe::Memorization,
    ];

    /// As presets and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            Probe::InContextRecall => "in-context-recall",
            Probe::NoisyInContextRecall => "noisy-in-context-recall",
            Probe::FuzzyInContextRecall => "fuzzy-in-context-recall",
            Probe::SelectiveCopying => "selective-copying",
            Probe::Compression => "compression",
            Probe::Memorization => "memorization",
        }
    }

    /// MAD's baseline setting of the probe (`mad/configs` and the task YAMLs, §1.2).
    pub fn baseline(self) -> Resolved {
        let base = Resolved {
            probe: self,
            vocab_size: 16,
            length: 128,
            train_examples: 12_800,
            test_examples: 1_280,
            noise_vocab_size: 0,
            frac_noise: 0.0,
            k_motif_size: 1,
            v_motif_size: 1,
            num_tokens_to_copy: 0,
            seed: 12_345,
        };
        match self {
            Probe::InContextRecall => base,
            Probe::NoisyInContextRecall => Resolved {
                vocab_size: 32,
                noise_vocab_size: 16,
                frac_noise: 0.2,
                ..base
            },
            Probe::FuzzyInContextRecall => Resolved {
                k_motif_size: 3,
                v_motif_size: 3,
                ..base
            },
            Probe::SelectiveCopying => Resolved {
                length: 256,
                num_tokens_to_copy: 16,
                ..base
            },
            Probe::Compression => Resolved { length: 32, ..base },
            Probe::Memorization => Resolved {
                vocab_size: 256,
                length: 32,
                train_examples: 256,
                ..base
            },
        }
    }
}

/// The `[task]` section with `kind = "mad"`: the probe, and any setting MAD's `changes` vary;
/// an unset one takes the probe's baseline ([`Probe::baseline`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MadConfig {
    pub probe: Probe,
    pub vocab_size: Option<usize>,
    /// MAD's L (`seq_len`): in-context and noisy recall rows are L − 1 tokens after the shift,
    /// the other probes' L.
    pub length: Option<usize>,
    pub train_examples: Option<usize>,
    pub test_examples: Option<usize>,
    /// Noisy recall: tokens `[V − noise, V)` are noise.
    pub noise_vocab_size: Option<usize>,
    /// Noisy recall: the chance that a pair's slot holds two noise tokens instead.
    pub frac_noise: Option<f64>,
    /// Fuzzy recall: the longest key and value motifs.
    pub k_motif_size: Option<usize>,
    pub v_motif_size: Option<usize>,
    /// Selective copying: the data tokens to copy.
    pub num_tokens_to_copy: Option<usize>,
    pub seed: Option<u64>,
    /// A folder of mad-lab's published data (`train/` and `test/`, each `inputs.npy` and
    /// `targets.npy`; see `mad_data.rs`): its rows replace the generated ones, and the settings
    /// above must describe them (`attnlab data import-mad DIR` writes them from its name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<std::path::PathBuf>,
}

static FACTS: super::TaskFacts = super::TaskFacts {
    name: "mad",
    summary: "one of MAD's six synthetic probes: in-context, noisy and fuzzy recall, selective \
              copying, compression, memorisation",
    paper: "Poli et al. 2024 (Mechanistic Design and Scaling of Hybrid Architectures); mad-lab",
    needs_causal: true,
    default: || super::TaskSpec::Mad(MadConfig::default()),
};

impl super::Listed for MadConfig {
    const FACTS: &'static super::TaskFacts = &FACTS;
}

impl super::Task for MadConfig {
    fn vocab_size(&self) -> usize {
        self.resolved().vocab_size
    }

    fn seq_len(&self) -> usize {
        self.resolved().row_len()
    }

    fn train_examples(&self) -> usize {
        self.resolved().train_examples
    }

    fn test_examples(&self) -> usize {
        self.resolved().test_examples
    }

    fn validate(&self) -> Result<()> {
        MadConfig::validate(self)
    }

    fn datasets(&self) -> Result<(Dataset, Dataset)> {
        MadConfig::datasets(self)
    }

    fn check_inputs_here(&self) -> Result<()> {
        self.check_data()
    }

    fn scores_its_inputs(&self) -> bool {
        self.probe == Probe::Compression
    }

    fn title(&self) -> Option<String> {
        Some(format!("MAD's {}", self.probe.name()))
    }

    /// The whole row: a recall probe's pairs run through it.
    fn truth_context(&self) -> Option<usize> {
        let resolved = self.resolved();
        resolved.has_ground_truth().then(|| resolved.row_len())
    }

    /// Generated, or read from mad-lab's published rows (at most the folder's).
    fn rows(&self, split: Split, n: usize) -> Result<Vec<Row>> {
        MadConfig::rows(self, split, n)
    }
}

/// Every setting of a probe, its baseline filled in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    pub probe: Probe,
    pub vocab_size: usize,
    pub length: usize,
    pub train_examples: usize,
    pub test_examples: usize,
    pub noise_vocab_size: usize,
    pub frac_noise: f64,
    pub k_motif_size: usize,
    pub v_motif_size: usize,
    pub num_tokens_to_copy: usize,
    pub seed: u64,
}

/// The largest MAD vocabulary (its largest setting is memorisation's 8,192).
const MAX_VOCAB: usize = 65_536;
/// The longest MAD row (its longest setting is 1,024).
const MAX_LENGTH: usize = 65_536;

impl MadConfig {
    /// The settings with the probe's baseline where unset.
    pub fn resolved(&self) -> Resolved {
        let b = self.probe.baseline();
        Resolved {
            probe: self.probe,
            vocab_size: self.vocab_size.unwrap_or(b.vocab_size),
            length: self.length.unwrap_or(b.length),
            train_examples: self.train_examples.unwrap_or(b.train_examples),
            test_examples: self.test_examples.unwrap_or(b.test_examples),
            noise_vocab_size: self.noise_vocab_size.unwrap_or(b.noise_vocab_size),
            frac_noise: self.frac_noise.unwrap_or(b.frac_noise),
            k_motif_size: self.k_motif_size.unwrap_or(b.k_motif_size),
            v_motif_size: self.v_motif_size.unwrap_or(b.v_motif_size),
            num_tokens_to_copy: self.num_tokens_to_copy.unwrap_or(b.num_tokens_to_copy),
            seed: self.seed.unwrap_or(b.seed),
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.resolved().validate()
    }

    /// The training and test datasets: generated, or read from `data`.
    pub fn datasets(&self) -> Result<(Dataset, Dataset)> {
        let resolved = self.resolved();
        Ok((
            Dataset::of_rows(
                resolved.row_len(),
                self.rows(Split::Train, resolved.train_examples)?,
            ),
            Dataset::of_rows(
                resolved.row_len(),
                self.rows(Split::Test, resolved.test_examples)?,
            ),
        ))
    }

    /// Whether `data`, if set, holds its four files, each with the rows, lengths and tokens
    /// the settings describe: read and checked as training reads them (a folder with the
    /// files of another probe or size had passed `attnlab check`, then failed to train).
    pub fn check_data(&self) -> Result<()> {
        let Some(dir) = &self.data else {
            return Ok(());
        };
        for file in super::mad_data::FILES {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(Error::RunDir {
                    message: "task.data's folder has no such file (mad-lab's data holds \
                              train/ and test/, each with inputs.npy and targets.npy)"
                        .into(),
                    path,
                });
            }
        }
        self.datasets().map(drop)
    }

    /// The first `n` rows of `split`: generated, or read from `data`.
    pub fn rows(&self, split: Split, n: usize) -> Result<Vec<Row>> {
        let resolved = self.resolved();
        match &self.data {
            Some(dir) => {
                let mut rows = super::mad_data::read_split(dir, split, &resolved)?;
                rows.truncate(n);
                Ok(rows)
            }
            None => Ok(resolved.rows(split, n)),
        }
    }
}

impl Resolved {
    /// Whether test rows say where each query must read ([`Row::queries`]).
    pub fn has_ground_truth(&self) -> bool {
        matches!(
            self.probe,
            Probe::InContextRecall | Probe::NoisyInContextRecall | Probe::SelectiveCopying
        )
    }

    /// Tokens per row as the model sees them.
    pub fn row_len(&self) -> usize {
        match self.probe {
            Probe::InContextRecall | Probe::NoisyInContextRecall => self.length - 1,
            _ => self.length,
        }
    }

    /// Settings the generators cannot honour, refused naming the key.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, value: &dyn std::fmt::Display, reason: String| {
            Err(Error::preset(format!("task.{key}"), value, reason))
        };
        let (v, l) = (self.vocab_size, self.length);
        if !(4..=MAX_VOCAB).contains(&v) {
            return bad("vocab_size", &v, format!("must be in 4..={MAX_VOCAB}"));
        }
        if !(4..=MAX_LENGTH).contains(&l) {
            return bad("length", &l, format!("must be in 4..={MAX_LENGTH}"));
        }
        if !(0.0..=1.0).contains(&self.frac_noise) {
            let shown = crate::error::number(self.frac_noise);
            return bad("frac_noise", &shown, "must be in 0..=1".into());
        }
        check_split_size("train_examples", self.train_examples, self.row_len())?;
        check_split_size("test_examples", self.test_examples, self.row_len())?;
        match self.probe {
            Probe::InContextRecall | Probe::NoisyInContextRecall => {
                if l % 2 != 0 {
                    return bad(
                        "length",
                        &l,
                        "must be even: the row is key-value pairs".into(),
                    );
                }
                if v < self.noise_vocab_size + 4 {
                    let reason = "leaves fewer than 4 key and value tokens beside the noise";
                    return bad("noise_vocab_size", &self.noise_vocab_size, reason.into());
                }
                if self.frac_noise > 0.0 && self.noise_vocab_size == 0 {
                    let reason = "needs noise tokens: set task.noise_vocab_size";
                    return bad("frac_noise", &self.frac_noise, reason.into());
                }
            }
            Probe::FuzzyInContextRecall => {
                let keys = (v - 1) / 2;
                if !(1..=keys.min(4)).contains(&self.k_motif_size)
                    || !(1..=(v - 1 - keys).min(4)).contains(&self.v_motif_size)
                {
                    let reason = format!("motifs of 1..=4 tokens, at most the {keys} keys");
                    return bad("k_motif_size", &self.k_motif_size, reason);
                }
                if l < 4 * (self.k_motif_size + self.v_motif_size) {
                    let reason = "is too short for two motif pairs and the probe".into();
                    return bad("length", &l, reason);
                }
            }
            Probe::SelectiveCopying => {
                let n = self.num_tokens_to_copy;
                if n == 0 || 2 * n + 1 > l {
                    let reason = format!("must be in 1..={} (2n + 1 ≤ length)", (l - 1) / 2);
                    return bad("num_tokens_to_copy", &n, reason);
                }
            }
            Probe::Compression => {}
            Probe::Memorization => {
                if l % 2 != 0 {
                    return bad(
                        "length",
                        &l,
                        "must be even: the row is key-insert pairs".into(),
                    );
                }
            }
        }
        Ok(())
    }

    /// The first `n` rows of `split`.
    pub fn rows(&self, split: Split, n: usize) -> Vec<Row> {
        let label = match split {
            Split::Train => "mad train",
            Split::Test => "mad test",
        };
        let mut rng = rng::stream(self.seed, label);
        let map = (self.probe == Probe::Memorization).then(|| self.memory());
        (0..n)
            .map(|_| match self.probe {
                Probe::InContextRecall | Probe::NoisyInContextRecall => {
                    let row = shifted(self.recall(&mut rng), split);
                    match split {
                        Split::Test => with_recall_truth(row),
                        Split::Train => row,
                    }
                }
                Probe::FuzzyInContextRecall => shifted(self.fuzzy_recall(&mut rng, split), split),
                Probe::SelectiveCopying => self.selective_copying(&mut rng),
                Probe::Compression => self.compression(&mut rng),
                Probe::Memorization => {
                    self.memorization(&mut rng, map.as_ref().unwrap_or(&Vec::new()))
                }
            })
            .collect()
    }

    /// The whole split as a dataset.
    pub fn generate(&self, split: Split) -> Dataset {
        let n = match split {
            Split::Train => self.train_examples,
            Split::Test => self.test_examples,
        };
        Dataset::of_rows(self.row_len(), self.rows(split, n))
    }

    /// In-context recall, noisy or not (MAD's multi-query form): L/2 − 1 key-value slots (a
    /// slot is two noise tokens with chance `frac_noise`, except one), keys drawn with
    /// replacement, a key's value fixed within the row, then a probe of a presented key. The
    /// targets are the values of keys presented before; see [`Unshifted`].
    fn recall(&self, rng: &mut AttnRng) -> Unshifted {
        let plain = (self.vocab_size - self.noise_vocab_size) as u32;
        let (keys, values) = (0..plain / 2, plain / 2..plain);
        let noise = plain..self.vocab_size as u32;
        let pairs = self.length / 2;
        // MAD draws it from all L/2 slots, of which its loop visits L/2 − 1, so every slot may
        // be noise (its probe then has no key to ask); drawn among the visited slots here.
        let not_noise = rng.random_range(0..pairs - 1);
        let mut row = Unshifted::default();
        let mut value_of: HashMap<u32, u32> = HashMap::new();
        let mut presented: Vec<u32> = Vec::new();
        for slot in 0..pairs - 1 {
            let noisy = self.noise_vocab_size > 0
                && rng.random::<f64>() < self.frac_noise
                && slot != not_noise;
            if noisy {
                for _ in 0..2 {
                    row.push(rng.random_range(noise.clone()), None);
                }
                continue;
            }
            let key = rng.random_range(keys.clone());
            let value = *value_of
                .entry(key)
                .or_insert_with(|| rng.random_range(values.clone()));
            let seen = presented.contains(&key);
            row.push(key, None);
            row.push(value, seen.then_some(value));
            if !seen {
                presented.push(key);
            }
        }
        // Slot `not_noise` is a pair, so a key was presented.
        let key = *presented.choose(rng).unwrap_or(&keys.start);
        let value = value_of.get(&key).copied().unwrap_or(values.start);
        row.push(key, None);
        row.push(value, Some(value));
        row
    }

    /// Fuzzy in-context recall: keys and values are motifs, ordered tuples of distinct
    /// tokens (keys from `[0, (V−1)/2)` of 1..=k tokens in training and exactly k at test,
    /// values from `[(V−1)/2, V−1)` of 1..=v), a key's value fixed within the row; the probe
    /// pair is put into the context once, then asked at the end; left-padded to L + 1 with
    /// the pad token V − 1.
    fn fuzzy_recall(&self, rng: &mut AttnRng, split: Split) -> Unshifted {
        let pad = (self.vocab_size - 1) as u32;
        let (keys, values) = (0..pad / 2, pad / 2..pad);
        let key_sizes = match split {
            Split::Train => 1..=self.k_motif_size,
            Split::Test => self.k_motif_size..=self.k_motif_size,
        };
        let value_sizes = 1..=self.v_motif_size;
        let key = |rng: &mut AttnRng| motif(rng, keys.clone(), key_sizes.clone());
        let value = |rng: &mut AttnRng| motif(rng, values.clone(), value_sizes.clone());
        let probe_key = key(rng);
        let probe_value = value(rng);
        let probe_len = probe_key.len() + probe_value.len();
        let probe_at = rng.random_range(0..self.length - 2 * probe_len);
        let longest = self.k_motif_size + self.v_motif_size;
        let mut row = Unshifted::default();
        let mut value_of: HashMap<Vec<u32>, Vec<u32>> = HashMap::new();
        value_of.insert(probe_key.clone(), probe_value.clone());
        let mut presented: Vec<Vec<u32>> = Vec::new();
        let mut probed = false;
        while row.inputs.len() < self.length - probe_len - longest {
            let (key, value) = match !probed && row.inputs.len() >= probe_at {
                true => {
                    probed = true;
                    (probe_key.clone(), probe_value.clone())
                }
                false => {
                    let (key, fresh) = (key(rng), value(rng));
                    let value = value_of.entry(key.clone()).or_insert(fresh).clone();
                    (key, value)
                }
            };
            row.push_pair(&key, &value, presented.contains(&key));
            if !presented.contains(&key) {
                presented.push(key);
            }
        }
        row.push_pair(&probe_key, &probe_value, true);
        let padding = (self.length + 1).saturating_sub(row.inputs.len());
        row.left_pad(pad, padding);
        row
    }

    /// Selective copying: n data tokens with L − 2n − 1 blanks put before them at random, the
    /// copy token, then n blanks at which the data tokens are to be written in order.
    fn selective_copying(&self, rng: &mut AttnRng) -> Row {
        let n = self.num_tokens_to_copy;
        let (copy, blank) = ((self.vocab_size - 1) as u32, (self.vocab_size - 2) as u32);
        let data: Vec<u32> = (0..n).map(|_| rng.random_range(0..blank)).collect();
        // MAD's np.insert of each blank before a data token 0..n−1: count blanks per slot.
        let mut before = vec![0usize; n];
        for _ in 0..self.length - 2 * n - 1 {
            before[rng.random_range(0..n)] += 1;
        }
        let mut inputs = Vec::with_capacity(self.length);
        let mut at = Vec::with_capacity(n);
        for (&token, &blanks) in data.iter().zip(&before) {
            inputs.extend(std::iter::repeat_n(blank, blanks));
            at.push(inputs.len());
            inputs.push(token);
        }
        inputs.push(copy);
        inputs.extend(std::iter::repeat_n(blank, n));
        let mut labels = vec![IGNORE; self.length - n];
        labels.extend(data.iter().map(|&t| t as i32));
        let queries = (0..n)
            .map(|j| QueryTruth {
                position: self.length - n + j,
                key: blank,
                value: data[j],
                key_positions: Vec::new(),
                value_positions: vec![at[j]],
            })
            .collect();
        Row {
            inputs,
            labels,
            queries,
        }
    }

    /// Compression: L − 1 uniform tokens and the compression token, every one its own target
    /// (MAD trains an auto-encoder on it).
    fn compression(&self, rng: &mut AttnRng) -> Row {
        let last = (self.vocab_size - 1) as u32;
        let mut inputs: Vec<u32> = (0..self.length - 1)
            .map(|_| rng.random_range(0..last))
            .collect();
        inputs.push(last);
        let labels = inputs.iter().map(|&t| t as i32).collect();
        Row {
            inputs,
            labels,
            queries: Vec::new(),
        }
    }

    /// Memorisation's fixed key → value map (MAD's `generate_kv_map` over the V − 1 tokens
    /// before the insert token): the shuffled keys `[0, (V−1)/2)` zipped with the shuffled
    /// values `[(V−1)/2, V−1)`, one value left over, from a stream of its own so both splits
    /// share it.
    pub fn memory(&self) -> Vec<(u32, u32)> {
        let mut rng = rng::stream(self.seed, "mad memorization map");
        let half = ((self.vocab_size - 1) / 2) as u32;
        let mut keys: Vec<u32> = (0..half).collect();
        let mut values: Vec<u32> = (half..(self.vocab_size - 1) as u32).collect();
        keys.shuffle(&mut rng);
        values.shuffle(&mut rng);
        keys.into_iter().zip(values).collect()
    }

    /// Memorisation: L/2 keys drawn with replacement, each followed by the insert token, at
    /// which the model must write the key's value from the fixed map (learned in its weights).
    fn memorization(&self, rng: &mut AttnRng, map: &[(u32, u32)]) -> Row {
        let insert = (self.vocab_size - 1) as u32;
        let mut row = Row {
            inputs: Vec::with_capacity(self.length),
            labels: Vec::with_capacity(self.length),
            queries: Vec::new(),
        };
        for _ in 0..self.length / 2 {
            let (key, value) = map.choose(rng).copied().unwrap_or((0, 0));
            row.inputs.extend([key, insert]);
            row.labels.extend([IGNORE, value as i32]);
        }
        row
    }
}

/// A recall row before MAD's shift: its tokens and, per token, the value it reveals when its
/// key was presented before (the test targets).
#[derive(Default)]
struct Unshifted {
    inputs: Vec<u32>,
    targets: Vec<Option<u32>>,
}

impl Unshifted {
    fn push(&mut self, token: u32, target: Option<u32>) {
        self.inputs.push(token);
        self.targets.push(target);
    }

    /// A key motif and its value motif, the value's tokens targets when the key was seen.
    fn push_pair(&mut self, key: &[u32], value: &[u32], seen: bool) {
        for &k in key {
            self.push(k, None);
        }
        for &v in value {
            self.push(v, seen.then_some(v));
        }
    }

    fn left_pad(&mut self, pad: u32, n: usize) {
        self.inputs.splice(0..0, std::iter::repeat_n(pad, n));
        self.targets.splice(0..0, std::iter::repeat_n(None, n));
    }
}

/// MAD's shift: the model reads tokens 0..len − 1 and outputs token p + 1 at position p; in
/// training every next token is scored, at test only the recalled values.
fn shifted(row: Unshifted, split: Split) -> Row {
    let n = row.inputs.len() - 1;
    let labels = match split {
        Split::Train => row.inputs[1..].iter().map(|&t| t as i32).collect(),
        Split::Test => row.targets[1..]
            .iter()
            .map(|t| t.map_or(IGNORE, |t| t as i32))
            .collect(),
    };
    Row {
        inputs: row.inputs[..n].to_vec(),
        labels,
        queries: Vec::new(),
    }
}

/// A recall test row's ground truth: each scored position holds a key, whose value the model
/// must read right after the key's latest earlier occurrence (keys and values are disjoint
/// tokens, so an equal token is that key).
pub(super) fn with_recall_truth(mut row: Row) -> Row {
    row.queries = (0..row.inputs.len())
        .filter(|&p| row.labels[p] != IGNORE)
        .filter_map(|p| {
            let key = row.inputs[p];
            let earlier = (0..p).rev().find(|&q| row.inputs[q] == key)?;
            Some(QueryTruth {
                position: p,
                key,
                value: row.labels[p] as u32,
                key_positions: vec![earlier],
                value_positions: vec![earlier + 1],
            })
        })
        .collect();
    row
}

/// A motif: a size drawn from `sizes`, then that many distinct tokens of `tokens` in random
/// order (every ordered tuple of that size equally likely; drawn by rejection, as motifs are
/// at most 4 tokens of at least as many).
fn motif(
    rng: &mut AttnRng,
    tokens: std::ops::Range<u32>,
    sizes: std::ops::RangeInclusive<usize>,
) -> Vec<u32> {
    let size = rng.random_range(sizes);
    loop {
        let drawn: Vec<u32> = (0..size)
            .map(|_| rng.random_range(tokens.clone()))
            .collect();
        let distinct = (1..drawn.len()).all(|i| !drawn[..i].contains(&drawn[i]));
        if distinct {
            return drawn;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(probe: Probe) -> Resolved {
        probe.baseline()
    }

    fn scored(row: &Row) -> usize {
        row.labels.iter().filter(|&&l| l != IGNORE).count()
    }

    /// §1.3's table: row lengths and scored positions per row of every baseline.
    #[test]
    fn baseline_rows_have_mads_lengths_and_scored_positions() {
        let mean = |rows: &[Row]| rows.iter().map(scored).sum::<usize>() as f64 / rows.len() as f64;
        let cases = [
            (Probe::InContextRecall, 127, 127),
            (Probe::NoisyInContextRecall, 127, 127),
            (Probe::FuzzyInContextRecall, 128, 128),
            (Probe::SelectiveCopying, 256, 16),
            (Probe::Compression, 32, 32),
            (Probe::Memorization, 32, 16),
        ];
        for (p, len, train_scored) in cases {
            let config = probe(p);
            assert_eq!(config.row_len(), len, "{p:?}");
            for row in config.rows(Split::Train, 50) {
                assert_eq!((row.inputs.len(), row.labels.len()), (len, len), "{p:?}");
                assert_eq!(scored(&row), train_scored, "{p:?} train");
                assert!(row.inputs.iter().all(|&t| (t as usize) < config.vocab_size));
            }
        }
        let test = |p: Probe| probe(p).rows(Split::Test, 400);
        // In-context recall: 56 per row (57 when one of the 8 keys never appears, ≈ 0.2 %).
        let recall = test(Probe::InContextRecall);
        assert!(recall.iter().all(|r| (56..=57).contains(&scored(r))));
        assert!(recall.iter().filter(|r| scored(r) == 56).count() > 390);
        // Noisy: 36–52, mean 43.7 (over 200 rows in the reference; a range here).
        let noisy = mean(&test(Probe::NoisyInContextRecall));
        assert!(
            (42.0..45.5).contains(&noisy),
            "noisy recall scores {noisy} per row"
        );
        // Fuzzy: 1–15, mean 4.2.
        let fuzzy = test(Probe::FuzzyInContextRecall);
        assert!(fuzzy.iter().all(|r| (1..=15).contains(&scored(r))));
        let fuzzy = mean(&fuzzy);
        assert!(
            (3.5..5.0).contains(&fuzzy),
            "fuzzy recall scores {fuzzy} per row"
        );
        for (p, n) in [(Probe::SelectiveCopying, 16), (Probe::Memorization, 16)] {
            assert!(test(p).iter().all(|r| scored(r) == n), "{p:?} test");
        }
    }

    /// Recall: every scored test target is the value its key got earlier in the row, and a
    /// value never comes before its key (it always follows it directly).
    #[test]
    fn recalled_values_follow_their_keys() {
        for p in [Probe::InContextRecall, Probe::NoisyInContextRecall] {
            let config = probe(p);
            let plain = (config.vocab_size - config.noise_vocab_size) as u32;
            for row in config.rows(Split::Test, 200) {
                let mut value_of = HashMap::new();
                for p in (0..row.inputs.len()).step_by(2) {
                    let key = row.inputs[p];
                    if key >= plain / 2 {
                        assert!(key >= plain, "a value at an even position: {key}");
                        continue;
                    }
                    let value = row
                        .inputs
                        .get(p + 1)
                        .copied()
                        .or_else(|| (row.labels[p] != IGNORE).then_some(row.labels[p] as u32));
                    let value = value.unwrap();
                    assert!(
                        (plain / 2..plain).contains(&value),
                        "{value} after key {key}"
                    );
                    let earlier = value_of.insert(key, value);
                    assert!(earlier.is_none_or(|e| e == value), "key {key}: two values");
                    match row.labels[p] {
                        IGNORE => assert!(earlier.is_none(), "a repeated key unscored at {p}"),
                        label => {
                            assert_eq!(label as u32, value);
                            let probe = p + 1 == row.inputs.len();
                            assert!(earlier.is_some() || probe, "first key scored at {p}");
                        }
                    }
                }
            }
        }
    }

    /// The ground truth of recall and selective copying points at the value each scored query
    /// outputs: a recall query at the token after its key's latest earlier occurrence, a copy
    /// at its data token.
    #[test]
    fn ground_truth_points_at_what_each_query_outputs() {
        for p in [
            Probe::InContextRecall,
            Probe::NoisyInContextRecall,
            Probe::SelectiveCopying,
        ] {
            for row in probe(p).rows(Split::Test, 50) {
                assert_eq!(
                    row.queries.len(),
                    scored(&row),
                    "{p:?}: a truth per scored query"
                );
                for q in &row.queries {
                    assert_eq!(row.labels[q.position], q.value as i32);
                    assert!(q.value_positions[0] < q.position);
                    assert_eq!(row.inputs[q.value_positions[0]], q.value, "{p:?} {q:?}");
                    if let Some(&k) = q.key_positions.first() {
                        let later = row.inputs[k + 1..q.position].contains(&q.key);
                        assert!(!later, "{p:?}: not the latest occurrence of key {}", q.key);
                    }
                }
            }
        }
        let train = probe(Probe::InContextRecall).rows(Split::Train, 1);
        assert!(
            train[0].queries.is_empty(),
            "training rows score every token, no truth"
        );
    }

    /// Fuzzy recall: test keys are all k tokens (the probe's key, read back before its value,
    /// is k tokens of keys); a scored value token is a value token.
    #[test]
    fn fuzzy_test_keys_have_the_full_motif_length() {
        let config = probe(Probe::FuzzyInContextRecall);
        let (pad, half) = (
            (config.vocab_size - 1) as u32,
            ((config.vocab_size - 1) / 2) as u32,
        );
        for row in config.rows(Split::Test, 200) {
            // The last run of key tokens before the final value: the probe's key.
            let last_value_start = (0..row.inputs.len())
                .rev()
                .find(|&p| row.inputs[p] < half)
                .unwrap();
            let run = (0..=last_value_start)
                .rev()
                .take_while(|&p| row.inputs[p] < half)
                .count();
            assert_eq!(run, config.k_motif_size, "{:?}", row.inputs);
            for (p, &label) in row.labels.iter().enumerate() {
                if label != IGNORE {
                    assert!(
                        (half..pad).contains(&(label as u32)),
                        "label {label} at {p}"
                    );
                }
            }
        }
    }

    /// Selective copying: exactly n data tokens before the copy token, the last directly
    /// before it, and the labels after it are those tokens in order.
    #[test]
    fn selective_copying_writes_its_data_tokens_in_order() {
        let config = probe(Probe::SelectiveCopying);
        let (copy, blank) = (
            (config.vocab_size - 1) as u32,
            (config.vocab_size - 2) as u32,
        );
        let n = config.num_tokens_to_copy;
        for row in config.rows(Split::Train, 100) {
            let at = row.inputs.iter().position(|&t| t == copy).unwrap();
            assert_eq!(at, config.length - n - 1);
            let data: Vec<u32> = row.inputs[..at]
                .iter()
                .copied()
                .filter(|&t| t != blank)
                .collect();
            assert_eq!(data.len(), n);
            assert_ne!(
                row.inputs[at - 1],
                blank,
                "the last data token sits before the copy"
            );
            let written: Vec<u32> = row.labels[at + 1..].iter().map(|&l| l as u32).collect();
            assert_eq!(written, data);
            assert!(row.inputs[at + 1..].iter().all(|&t| t == blank));
        }
    }

    /// Memorisation: the same map in both splits (127 keys at V = 256, each its own value of
    /// `[127, 255)`), every scored label the map's value of the key before it.
    #[test]
    fn memorization_uses_one_map_in_both_splits() {
        let config = probe(Probe::Memorization);
        let map: HashMap<u32, u32> = config.memory().into_iter().collect();
        assert_eq!(map.len(), 127);
        let values: std::collections::BTreeSet<u32> = map.values().copied().collect();
        assert_eq!(values.len(), 127);
        assert!(values.iter().all(|v| (127..255).contains(v)));
        for split in [Split::Train, Split::Test] {
            for row in config.rows(split, 50) {
                for p in (0..row.inputs.len()).step_by(2) {
                    assert_eq!(row.inputs[p + 1], 255);
                    assert_eq!(row.labels[p + 1] as u32, map[&row.inputs[p]]);
                }
            }
        }
    }

    /// Rows are reproducible from the seed, and the splits differ.
    #[test]
    fn rows_are_seeded() {
        for p in Probe::ALL {
            let config = probe(p);
            assert_eq!(
                config.rows(Split::Train, 3),
                config.rows(Split::Train, 3),
                "{p:?}"
            );
            let other = Resolved { seed: 1, ..config };
            assert_ne!(
                config.rows(Split::Train, 3),
                other.rows(Split::Train, 3),
                "{p:?}"
            );
        }
    }

    /// Compression: L − 1 tokens before the compression token V − 1, each position its own
    /// target, in both splits.
    #[test]
    fn compression_scores_every_token_against_itself() {
        let config = MadConfig {
            probe: Probe::Compression,
            ..MadConfig::default()
        };
        config.validate().unwrap();
        let (train, test) = config.datasets().unwrap();
        for data in [&train, &test] {
            for i in 0..data.len() {
                let (row, labels) = (data.row(i), data.row_labels(i));
                assert_eq!(row.len(), 32);
                assert_eq!(row[31], 15);
                assert!(row[..31].iter().all(|&t| t < 15));
                assert!(row.iter().zip(labels).all(|(&t, &l)| l == t as i32));
            }
        }
    }

    #[test]
    fn settings_it_cannot_honour_are_refused_naming_the_key() {
        let cases = [
            (
                Probe::InContextRecall,
                MadConfig {
                    length: Some(127),
                    ..MadConfig::default()
                },
                "task.length",
            ),
            (
                Probe::SelectiveCopying,
                MadConfig {
                    num_tokens_to_copy: Some(200),
                    ..MadConfig::default()
                },
                "task.num_tokens_to_copy",
            ),
            (
                Probe::NoisyInContextRecall,
                MadConfig {
                    noise_vocab_size: Some(30),
                    ..MadConfig::default()
                },
                "task.noise_vocab_size",
            ),
        ];
        for (p, config, key) in cases {
            let error = MadConfig { probe: p, ..config }
                .validate()
                .unwrap_err()
                .to_string();
            assert!(error.contains(key), "{p:?}: {error}");
        }
    }
}
