//! Perplexity against evaluation length of a pretrained model (a Hugging Face folder) on a
//! text the user supplies: as trained, and for a rotary model (Pythia) with each inference-time
//! scaling of [`super::variants`] (PI, NTK, ReRoPE, Leaky ReRoPE with log-n), the model rebuilt
//! on the same weights at every length. The training length L is the model's positions
//! (`max_position_embeddings`: Pythia's 2,048, GPT-2's 1,024); learned positions (GPT-2,
//! GPT-Neo) have none past L, so those lengths are reported missing with a note. attnlab
//! cannot download WikiText: the numbers are on the user's file, and say so.

use std::path::Path;
use std::sync::atomic::AtomicBool;

use candle_core::Device;

use super::{
    Curve, Extrapolation, Length, LengthPoint, Options, Variant, perplexity, score_length,
};
use crate::analysis::StudiedEncoding;
use crate::checkpoint::{self, Pretrained, TextTokenizer};
use crate::encodings::{EncodingShape, EncodingSpec};
use crate::preset::encoding_with;
use crate::{Error, Result};

/// The largest text file scored: WikiText-103's test split is 1.3 MB, its training split 540 MB.
const MAX_CORPUS: u64 = 256 << 20;

/// L/4, L/2, L, 2L, 4L: to four times the model's positions, as the check asks.
pub fn default_lengths(train_length: usize) -> Vec<usize> {
    [4, 2]
        .map(|k| (train_length / k).max(1))
        .into_iter()
        .chain([1, 2, 4].map(|k| train_length * k))
        .collect()
}

/// The model in Hugging Face folder `folder` on the text in `corpus` (read through the folder's
/// tokenizer, without a beginning-of-sequence token, as Hugging Face's perplexity protocol
/// reads it): [`extrapolate_pretrained`] for the command line and the window.
pub fn extrapolate_folder(
    folder: &Path,
    corpus: &Path,
    options: &Options,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Extrapolation> {
    options.validate()?;
    let pretrained = checkpoint::open(folder, &Device::Cpu)?;
    let text = crate::io::read_text(corpus, "corpus", MAX_CORPUS)?;
    // Only `max_tokens` tokens are scored: the text's start is enough (a token is a few
    // bytes), so a large corpus is not tokenised whole.
    let enough = text.floor_char_boundary(options.max_tokens.saturating_add(1).saturating_mul(32));
    let tokens =
        TextTokenizer::open(folder)?.encode(&text[..enough], None, pretrained.vocab_size)?;
    extrapolate_pretrained(&pretrained, folder, &tokens.ids, options, progress, cancel)
}

/// Every curve of `pretrained` (opened from `folder`) on the token stream `tokens`.
pub fn extrapolate_pretrained(
    pretrained: &Pretrained,
    folder: &Path,
    tokens: &[u32],
    options: &Options,
    progress: &mut dyn FnMut(f32),
    cancel: &AtomicBool,
) -> Result<Extrapolation> {
    options.validate()?;
    let train_length = pretrained.max_len;
    let lengths = match options.lengths.is_empty() {
        true => default_lengths(train_length),
        false => options.lengths.clone(),
    };
    // Lengths past a position table are reported missing, so the text need only cover the
    // longest length the model can run at.
    let limit = super::position_limit(&pretrained.encoding, train_length);
    let runnable = lengths
        .iter()
        .copied()
        .filter(|&n| limit.is_none_or(|l| n <= l));
    let longest = runnable.max().unwrap_or(train_length);
    let available = tokens.len().saturating_sub(1).min(options.max_tokens);
    let span = available / longest * longest;
    if span == 0 {
        return Err(Error::Data(format!(
            "the text has {} tokens, fewer than the longest length {longest} + 1: give a longer \
             text or shorter --lengths",
            tokens.len()
        )));
    }
    let variants = match options.rotary_variants {
        true => super::inference_variants(&pretrained.encoding),
        false => Vec::new(),
    };
    let mut all = Extrapolation::new(options, train_length, lengths.clone());
    let curves = 1 + variants.len();
    let pass = perplexity::Pass {
        tokens,
        span,
        protocol: options.protocol,
        stride: options.stride,
        chunk: options.chunk,
        batch_tokens: options.batch_tokens,
    };
    let name = folder.file_name().map_or_else(
        || pretrained.family.clone(),
        |n| n.to_string_lossy().into_owned(),
    );
    for (c, variant) in std::iter::once(None)
        .chain(variants.iter().map(Some))
        .enumerate()
    {
        let mut points = Vec::new();
        for (i, &n) in lengths.iter().enumerate() {
            let mut encoding = pretrained.encoding.clone();
            if let Some(variant) = variant {
                match variant_encoding(pretrained, variant, n) {
                    Ok(spec) => encoding = spec,
                    Err(why) => {
                        points.push(LengthPoint::missing(n, why.to_string()));
                        continue;
                    }
                }
            }
            let limit = super::position_limit(&encoding, train_length);
            let at = Length {
                n,
                heads: pretrained.model_config.n_heads,
                encoding: &encoding,
                limit,
            };
            let build = || pretrained.with_encoding(&encoding, n.max(train_length));
            let mut tick = |done: usize, total: usize| {
                let length = (i as f32 + done as f32 / total.max(1) as f32) / lengths.len() as f32;
                progress((c as f32 + length) / curves as f32)
            };
            points.push(score_length(
                at,
                &pass,
                &Device::Cpu,
                build,
                &mut tick,
                cancel,
            )?);
        }
        // The curve is named and judged by its encoding at L (a scaling that does not apply to
        // the model says why instead).
        let (encoding, verdict) =
            match variant.map(|v| variant_encoding(pretrained, v, train_length)) {
                None => (
                    pretrained.encoding.name().to_string(),
                    theorem(pretrained, &pretrained.encoding)?,
                ),
                Some(Ok(spec)) => (spec.name().to_string(), theorem(pretrained, &spec)?),
                Some(Err(why)) => {
                    let label = variant.map_or("", |v| v.label);
                    (
                        label.to_string(),
                        ("not-applicable".to_string(), why.to_string()),
                    )
                }
            };
        let curve = Curve {
            name: match variant {
                Some(v) => format!("{name} + {}", v.label),
                None => name.clone(),
            },
            run: folder.to_path_buf(),
            encoding,
            inference: variant.map(|v| v.description.to_string()),
            points,
            extrapolates: None,
            delta: Vec::new(),
            theorem: verdict.0,
            theorem_evidence: verdict.1,
            device_notice: None,
        };
        all.push(curve.judged(&lengths, train_length, options.delta));
    }
    progress(1.0);
    Ok(all)
}

/// `variant`'s encoding of the model at length `n`, or why it does not apply to this model (a
/// scaling that needs more rotated channels than the model's heads have).
fn variant_encoding(pretrained: &Pretrained, variant: &Variant, n: usize) -> Result<EncodingSpec> {
    let train_length = pretrained.max_len;
    let overrides = variant.overrides(n, train_length);
    let spec = encoding_with(&pretrained.encoding, &overrides)?.at_training_length(train_length);
    let config = &pretrained.model_config;
    spec.validate(&EncodingShape {
        d_model: config.d_model,
        n_heads: config.n_heads,
        qk_dim: pretrained.mechanism.qk_dim(config.head_dim()),
        max_len: n.max(train_length),
        embedding_std: 0.02,
    })?;
    Ok(spec)
}

/// Theorem 0.4's verdict for `encoding` at the model's head shape, and its evidence.
fn theorem(pretrained: &Pretrained, encoding: &EncodingSpec) -> Result<(String, String)> {
    let config = &pretrained.model_config;
    let qk_dim = pretrained.mechanism.qk_dim(config.head_dim());
    let verdict = StudiedEncoding::untrained(encoding, config.n_heads, qk_dim)?.verdict()?;
    Ok((verdict.verdict, verdict.evidence))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn fixture(name: &str) -> (PathBuf, Pretrained) {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hf")
            .join(name);
        let model = checkpoint::open(&folder, &Device::Cpu).unwrap();
        (folder, model)
    }

    /// A random stream the fixture models have never seen: perplexity near the vocabulary.
    fn stream(n: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
    }

    /// Pythia's rotary model: the curve as trained and one per inference scaling, each with a
    /// perplexity at every length up to 4L; at L and below PI and NTK change nothing (k = 1).
    #[test]
    fn a_rotary_model_gets_a_curve_per_scaling_to_four_times_its_positions() {
        let (folder, model) = fixture("pythia");
        let l = model.max_len;
        let options = Options {
            lengths: vec![l / 2, l, 2 * l, 4 * l],
            ..Options::default()
        };
        let tokens = stream(4 * l + 1, model.vocab_size);
        let never = AtomicBool::new(false);
        let sweep = extrapolate_pretrained(&model, &folder, &tokens, &options, &mut |_| {}, &never)
            .unwrap();
        let names: Vec<&str> = sweep.curves.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names.len(),
            1 + super::super::inference_variants(&model.encoding).len()
        );
        assert_eq!(names[0], "pythia");
        // Every point has a perplexity, or says why the scaling does not apply to the fixture
        // (its heads rotate 2 channels; NTK's exponent d/(d − 2) needs more).
        for point in sweep.curves.iter().flat_map(|c| &c.points) {
            let why = point.note.as_deref().unwrap_or_default();
            assert!(
                point.ppl.is_some_and(f64::is_finite) || why.contains("channels"),
                "{point:?}"
            );
        }
        let at = |name: &str, i: usize| sweep.ppl[name][i];
        assert!((0..4).all(|i| at("pythia", i).is_some()));
        let mut compared = 0;
        for scaled in ["pythia + pi", "pythia + ntk"] {
            let (Some(short), Some(long)) = (at(scaled, 1), at(scaled, 3)) else {
                continue;
            };
            let base = at("pythia", 1).unwrap();
            assert!(
                (short - base).abs() < 1e-9 * base,
                "{scaled} changes L: {short} vs {base}"
            );
            assert_ne!(
                Some(long),
                at("pythia", 3),
                "{scaled} changes nothing at 4L"
            );
            compared += 1;
        }
        assert!(compared > 0, "no scaling applied: {:?}", sweep.ppl);
    }

    /// GPT-2's learned positions end at L: longer lengths are missing, with the reason.
    #[test]
    fn learned_positions_have_no_perplexity_past_their_table() {
        let (folder, model) = fixture("gpt2");
        let l = model.max_len;
        let options = Options {
            lengths: vec![l, 2 * l],
            ..Options::default()
        };
        let tokens = stream(2 * l + 1, model.vocab_size);
        let never = AtomicBool::new(false);
        let sweep = extrapolate_pretrained(&model, &folder, &tokens, &options, &mut |_| {}, &never)
            .unwrap();
        assert_eq!(
            sweep.curves.len(),
            1,
            "no rotary scalings for learned positions"
        );
        let points = &sweep.curves[0].points;
        assert!(points[0].ppl.is_some());
        assert!(points[1].ppl.is_none());
        assert!(
            points[1].note.as_deref().unwrap().contains("first"),
            "{points:?}"
        );
    }

    #[test]
    fn a_text_shorter_than_the_longest_length_is_refused_in_words() {
        let (folder, model) = fixture("pythia");
        let options = Options {
            lengths: vec![64],
            ..Options::default()
        };
        let never = AtomicBool::new(false);
        let short = stream(10, model.vocab_size);
        let error = extrapolate_pretrained(&model, &folder, &short, &options, &mut |_| {}, &never)
            .err()
            .unwrap();
        assert!(
            error
                .to_string()
                .contains("fewer than the longest length 64"),
            "{error}"
        );
    }
}
