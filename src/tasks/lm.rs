//! Language modelling: next-token prediction on a text corpus ([`super::corpus`]).
//!
//! Tokens are bytes (vocabulary 256, any text works) or characters (the `vocab_size − 1` most
//! frequent characters of the training text, id 0 for every other character). Training rows are
//! `train_examples` windows of `seq_len + 1` tokens at seeded offsets into the training text,
//! each position labelled with the next token; test rows are the first non-overlapping windows
//! of the validation text. Length extrapolation evaluates on the whole validation stream
//! ([`LmConfig::validation_tokens`]).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::corpus::{CorpusSource, Part};
use super::{Dataset, check_split_size};
use crate::rng::{self, Rng};
use crate::{Error, Result};

/// How text becomes token ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tokens {
    /// UTF-8 bytes, vocabulary 256.
    #[default]
    Bytes,
    /// Characters, the most frequent `vocab_size − 1` of the training text; id 0 = other.
    Chars,
}

impl Tokens {
    /// Token `id` for a reader: a printable ASCII byte as itself in quotes (`'a'`, `' '`),
    /// a control byte escaped (`'\n'`), any other byte (part of a UTF-8 character) in hex
    /// (`0xc3`); a character id as its character in quotes, from `characters`
    /// ([`LmConfig::characters`]: the ids follow the training text's frequencies, which the
    /// run folder does not keep), `other` for id 0, `#id` without them.
    pub fn label(self, id: u32, characters: Option<&[char]>) -> String {
        let character = characters.and_then(|c| c.get(id as usize));
        match (self, u8::try_from(id), character) {
            (Self::Bytes, Ok(byte), _) if byte.is_ascii() => {
                format!("'{}'", byte.escape_ascii())
            }
            (Self::Bytes, Ok(byte), _) => format!("{byte:#04x}"),
            (Self::Chars, _, Some(_)) if id == 0 => "other".into(),
            (Self::Chars, _, Some(c)) => format!("'{}'", c.escape_debug()),
            (Self::Bytes, Err(_), _) | (Self::Chars, _, None) => format!("#{id}"),
        }
    }
}

/// The most text one split reads: the text is held in memory whole, as its tokens are.
pub const MAX_TEXT_BYTES: usize = 1 << 30;

/// Language-modelling settings (the `[task]` section with `kind = "lm"`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmConfig {
    /// `auto`, `cargo-registry`, `rust-docs`, `generated`, or a UTF-8 file or folder.
    pub corpus: String,
    pub tokens: Tokens,
    /// 256 for bytes; the vocabulary cap for characters.
    pub vocab_size: usize,
    /// Training length L.
    pub seq_len: usize,
    /// Bytes of training text read (the corpus is never loaded whole).
    pub train_bytes: usize,
    /// Bytes of validation text read; extrapolation scores this stream at every length.
    pub valid_bytes: usize,
    /// Share of the corpus's files (or of a single file's tail) kept for validation, in per cent.
    pub val_percent: u32,
    /// Training windows of `seq_len` tokens, drawn at seeded offsets.
    pub train_examples: usize,
    /// Validation windows of `seq_len` tokens for the training-time evaluation.
    pub test_examples: usize,
    /// Seed of the file order, the split and the window offsets.
    pub seed: u64,
}

static FACTS: super::TaskFacts = super::TaskFacts {
    name: "lm",
    summary: "next-token prediction on a text corpus, by bytes or characters",
    paper: "the RPE papers' language-model experiments (perplexity against length)",
    needs_causal: true,
    default: || super::TaskSpec::Lm(LmConfig::default()),
};

impl super::Listed for LmConfig {
    const FACTS: &'static super::TaskFacts = &FACTS;
}

impl super::Task for LmConfig {
    super::sizes_from_fields!();

    fn validate(&self) -> Result<()> {
        LmConfig::validate(self)
    }

    fn datasets(&self) -> Result<(Dataset, Dataset)> {
        LmConfig::datasets(self)
    }

    fn check_inputs_here(&self) -> Result<()> {
        self.check_corpus()
    }

    /// The training and validation text, about five bytes a byte once read and encoded.
    fn extra_data_bytes(&self) -> f64 {
        5.0 * (self.train_bytes as f64 + self.valid_bytes as f64)
    }
}

impl Default for LmConfig {
    fn default() -> Self {
        Self {
            corpus: "auto".into(),
            tokens: Tokens::Bytes,
            vocab_size: 256,
            seq_len: 64,
            train_bytes: 2_000_000,
            valid_bytes: 262_144,
            val_percent: 10,
            train_examples: 20_000,
            test_examples: 256,
            seed: 0,
        }
    }
}

impl LmConfig {
    /// Checks ranges; errors name `task.…`. Whether the corpus exists is checked when it is read.
    pub fn validate(&self) -> Result<()> {
        let err = |key: &str, value: &dyn ToString, why: String| {
            Err(Error::preset(format!("task.{key}"), value.to_string(), why))
        };
        match self.tokens {
            Tokens::Bytes if self.vocab_size != 256 => {
                return err(
                    "vocab_size",
                    &self.vocab_size,
                    "must be 256 with tokens = \"bytes\"".into(),
                );
            }
            Tokens::Chars if !(2..=65_536).contains(&self.vocab_size) => {
                return err(
                    "vocab_size",
                    &self.vocab_size,
                    "must be in 2..=65536".into(),
                );
            }
            _ => {}
        }
        if !(2..=65_536).contains(&self.seq_len) {
            return err("seq_len", &self.seq_len, "must be in 2..=65536".into());
        }
        if !(1..=99).contains(&self.val_percent) {
            return err("val_percent", &self.val_percent, "must be in 1..=99".into());
        }
        if self.train_examples == 0 {
            return err("train_examples", &0, "must be ≥ 1".into());
        }
        if self.test_examples == 0 {
            return err("test_examples", &0, "must be ≥ 1".into());
        }
        check_split_size("train_examples", self.train_examples, self.seq_len)?;
        check_split_size("test_examples", self.test_examples, self.seq_len)?;
        for (key, bytes) in [
            ("train_bytes", self.train_bytes),
            ("valid_bytes", self.valid_bytes),
        ] {
            if bytes > MAX_TEXT_BYTES {
                return err(
                    key,
                    &bytes,
                    format!("must be at most {MAX_TEXT_BYTES} (1 GiB)"),
                );
            }
        }
        let min_valid = (self.test_examples * self.seq_len + 1).max(self.seq_len + 1);
        if self.valid_bytes < min_valid {
            return err(
                "valid_bytes",
                &self.valid_bytes,
                format!("must hold test_examples × seq_len + 1 = {min_valid} tokens at least"),
            );
        }
        if self.train_bytes < 2 * (self.seq_len + 1) {
            return err(
                "train_bytes",
                &self.train_bytes,
                format!(
                    "must be at least 2 × (seq_len + 1) = {}",
                    2 * (self.seq_len + 1)
                ),
            );
        }
        Ok(())
    }

    /// Whether `corpus` names a built-in corpus, or a file or folder here with text to read
    /// ([`CorpusSource::resolve`]).
    pub fn check_corpus(&self) -> Result<()> {
        self.source().map(|_| ())
    }

    /// The text `corpus` names on this machine, in words ([`CorpusSource::describe`]).
    pub fn corpus_description(&self) -> Result<String> {
        self.source().map(|source| source.describe())
    }

    fn source(&self) -> Result<CorpusSource> {
        CorpusSource::resolve(&self.corpus)
    }

    fn text(&self, part: Part) -> Result<String> {
        let budget = match part {
            Part::Train => self.train_bytes,
            Part::Validation => self.valid_bytes,
        };
        self.source()?
            .read(part, budget, self.seed, self.val_percent)
    }

    /// The tokenizer: identity on bytes, or the character vocabulary of the training text.
    fn tokenizer(&self, train_text: Option<&str>) -> Result<Tokenizer> {
        match self.tokens {
            Tokens::Bytes => Ok(Tokenizer::Bytes),
            Tokens::Chars => {
                let owned;
                let text = match train_text {
                    Some(t) => t,
                    None => {
                        owned = self.text(Part::Train)?;
                        &owned
                    }
                };
                Ok(Tokenizer::chars(text, self.vocab_size))
            }
        }
    }

    /// The character of each id (index 0, the id of every other character, holds U+FFFD),
    /// rebuilt from the training text as training built them; `None` for byte tokens.
    pub fn characters(&self) -> Result<Option<Vec<char>>> {
        Ok(match self.tokenizer(None)? {
            Tokenizer::Bytes => None,
            Tokenizer::Chars(ids) => {
                let mut characters = vec![char::REPLACEMENT_CHARACTER; ids.len() + 1];
                for (c, id) in ids {
                    characters[id as usize] = c;
                }
                Some(characters)
            }
        })
    }

    /// The validation text as token ids: the stream extrapolation is measured on.
    pub fn validation_tokens(&self) -> Result<Vec<u32>> {
        let tokenizer = self.tokenizer(None)?;
        Ok(tokenizer.encode(&self.text(Part::Validation)?))
    }

    /// Training windows and validation windows.
    pub fn datasets(&self) -> Result<(Dataset, Dataset)> {
        let train_text = self.text(Part::Train)?;
        let tokenizer = self.tokenizer(Some(&train_text))?;
        let train = tokenizer.encode(&train_text);
        drop(train_text);
        let valid = tokenizer.encode(&self.text(Part::Validation)?);
        let t = self.seq_len;
        if train.len() < t + 1 {
            return Err(Error::Data(format!(
                "the training text of corpus '{}' has {} tokens, fewer than task.seq_len + 1 = {}",
                self.corpus,
                train.len(),
                t + 1
            )));
        }
        let mut offsets = rng::stream(self.seed, "lm-windows");
        let starts: Vec<usize> = (0..self.train_examples)
            .map(|_| offsets.random_range(0..=train.len() - t - 1))
            .collect();
        let rows = valid.len().saturating_sub(1) / t;
        if rows < self.test_examples {
            return Err(Error::Data(format!(
                "the validation text of corpus '{}' has {} tokens: only {rows} windows of \
                 {t}, fewer than task.test_examples = {}; lower it or raise task.valid_bytes",
                self.corpus,
                valid.len(),
                self.test_examples
            )));
        }
        let test_starts: Vec<usize> = (0..self.test_examples).map(|r| r * t).collect();
        Ok((
            windows(&train, &starts, t),
            windows(&valid, &test_starts, t),
        ))
    }
}

/// Rows `stream[s..s+t]` labelled with `stream[s+1..s+t+1]`.
fn windows(stream: &[u32], starts: &[usize], t: usize) -> Dataset {
    let mut inputs = Vec::with_capacity(starts.len() * t);
    let mut labels = Vec::with_capacity(starts.len() * t);
    for &s in starts {
        inputs.extend_from_slice(&stream[s..s + t]);
        labels.extend(stream[s + 1..s + t + 1].iter().map(|&x| x as i32));
    }
    Dataset {
        seq_len: t,
        inputs,
        labels,
        queries: Vec::new(),
    }
}

enum Tokenizer {
    Bytes,
    Chars(HashMap<char, u32>),
}

impl Tokenizer {
    /// The `vocab_size − 1` most frequent characters (ties by code point) get ids 1...
    fn chars(text: &str, vocab_size: usize) -> Self {
        let mut counts: HashMap<char, usize> = HashMap::new();
        for c in text.chars() {
            *counts.entry(c).or_default() += 1;
        }
        let mut by_count: Vec<(char, usize)> = counts.into_iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Self::Chars(
            by_count
                .into_iter()
                .take(vocab_size - 1)
                .enumerate()
                .map(|(i, (c, _))| (c, i as u32 + 1))
                .collect(),
        )
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        match self {
            Self::Bytes => text.bytes().map(u32::from).collect(),
            Self::Chars(ids) => text
                .chars()
                .map(|c| ids.get(&c).copied().unwrap_or(0))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_next_token() {
        let d = windows(&[5, 6, 7, 8, 9], &[0, 2], 2);
        assert_eq!(d.inputs, vec![5, 6, 7, 8]);
        assert_eq!(d.labels, vec![6, 7, 8, 9]);
    }

    #[test]
    fn byte_tokens_read_as_characters() {
        let labels: Vec<String> = [97, 32, 10, 39, 0xc3, 300]
            .map(|id| Tokens::Bytes.label(id, None))
            .into();
        assert_eq!(labels, ["'a'", "' '", "'\\n'", "'\\''", "0xc3", "#300"]);
        assert_eq!(Tokens::Chars.label(5, None), "#5");
    }

    /// Character ids read back as the characters the training text gave them, id 0 as the
    /// others, an id past the vocabulary as its number.
    #[test]
    fn character_tokens_read_as_their_characters() {
        let lm = LmConfig {
            corpus: "generated".into(),
            tokens: Tokens::Chars,
            vocab_size: 8,
            train_bytes: 4096,
            ..LmConfig::default()
        };
        let characters = lm.characters().unwrap().unwrap();
        assert_eq!(characters.len(), 8);
        let text = lm.text(Part::Train).unwrap();
        let tokenizer = lm.tokenizer(Some(&text)).unwrap();
        let sample: String = text.chars().take(200).collect();
        for (c, id) in sample.chars().zip(tokenizer.encode(&sample)) {
            let label = Tokens::Chars.label(id, Some(&characters));
            match id {
                0 => assert_eq!(label, "other"),
                _ => assert_eq!(label, format!("'{}'", c.escape_debug())),
            }
        }
        assert_eq!(Tokens::Chars.label(9, Some(&characters)), "#9");
        assert_eq!(LmConfig::default().characters().unwrap(), None);
    }

    #[test]
    fn char_vocabulary_keeps_the_most_frequent() {
        let t = Tokenizer::chars("aaabbc", 3);
        assert_eq!(t.encode("abcx"), vec![1, 2, 0, 0]);
        assert_eq!(Tokenizer::Bytes.encode("é"), vec![0xC3, 0xA9]);
    }

    #[test]
    fn generated_corpus_gives_datasets() {
        let c = LmConfig {
            corpus: "generated".into(),
            seq_len: 8,
            train_bytes: 1000,
            valid_bytes: 200,
            train_examples: 10,
            test_examples: 4,
            ..LmConfig::default()
        };
        c.validate().unwrap();
        let (train, test) = c.datasets().unwrap();
        assert_eq!((train.len(), test.len()), (10, 4));
        assert_eq!(c.validation_tokens().unwrap().len(), 200);
        assert_eq!(test.row(1), &c.validation_tokens().unwrap()[8..16]);
    }

    /// 40 validation bytes hold 4 windows of 8, not the 16 test rows asked.
    #[test]
    fn a_validation_text_too_short_is_a_data_error() {
        let c = LmConfig {
            corpus: "generated".into(),
            seq_len: 8,
            train_bytes: 1000,
            valid_bytes: 40,
            test_examples: 16,
            ..LmConfig::default()
        };
        match c.datasets() {
            Err(Error::Data(m)) => assert!(m.contains("task.test_examples = 16"), "{m}"),
            Err(e) => panic!("not a data error: {e}"),
            Ok(_) => panic!("16 rows from 40 bytes"),
        }
    }

    #[test]
    fn byte_tokens_need_vocabulary_256() {
        let c = LmConfig {
            vocab_size: 100,
            ..LmConfig::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("task.vocab_size = 100"), "{err}");
    }

    /// `test_examples × seq_len` used to overflow (a panic in debug builds, a wrapped and
    /// passing check in release ones).
    #[test]
    fn overflowing_sizes_are_refused_naming_the_key() {
        for (config, key) in [
            (
                LmConfig {
                    test_examples: 1 << 62,
                    ..LmConfig::default()
                },
                "task.test_examples = 4611686018427387904",
            ),
            (
                LmConfig {
                    train_examples: 1_000_000_000_000,
                    ..LmConfig::default()
                },
                "task.train_examples",
            ),
            (
                LmConfig {
                    train_bytes: usize::MAX,
                    ..LmConfig::default()
                },
                "task.train_bytes",
            ),
        ] {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
