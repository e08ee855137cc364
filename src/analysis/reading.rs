//! A pretrained model reading a text: the text's tokens, every head's map on them, and each
//! head's scores on the text ([`crate::analysis::heads`]). `attnlab attend` reports it; the
//! window's Pretrained view draws it.

use candle_core::{Device, Tensor};

use crate::analysis::heads::{HeadScores, InductionProbe, head_scores};
use crate::checkpoint::{Pretrained, TextTokenizer, Tokens};
use crate::{Error, Result};

/// One head's row-normalised weights, `[query][key]` over keys 0..=query.
pub type HeadMap = Vec<Vec<f32>>;

/// What [`read_text`] returns.
pub struct TextReading {
    pub tokens: Tokens,
    /// `[layer][head]`: each head's map, for the layers that attend.
    pub attention: Vec<Vec<HeadMap>>,
    /// The model layer of each entry of `attention`.
    pub layers: Vec<usize>,
    /// Previous-token, first-token and entropy scores of each head on the text (its
    /// induction score needs the induction probe: NaN here).
    pub scores: Vec<HeadScores>,
}

impl TextReading {
    /// The tokens as a (1, T) tensor on `device`, the input of an ablation.
    pub fn ids(&self, device: &Device) -> Result<Tensor> {
        let n = self.tokens.ids.len();
        Ok(Tensor::from_vec(self.tokens.ids.clone(), (1, n), device)?)
    }
}

/// `text` through `tokenizer`, after the model's beginning-of-sequence token when `first`
/// (TransformerLens prepends it), as the model reads it; an empty text or one longer than
/// the model's positions is refused.
pub fn tokenise(
    pretrained: &Pretrained,
    tokenizer: &TextTokenizer,
    text: &str,
    first: bool,
) -> Result<Tokens> {
    let first = pretrained.first_token.filter(|_| first);
    let tokens = tokenizer.encode(text, first, pretrained.vocab_size)?;
    // The text's own tokens: the first token alone reads nothing.
    let n = tokens.ids.len() - usize::from(first.is_some());
    let refused = |reason: String| Error::Argument {
        name: "the text".into(),
        value: format!("of {n} tokens"),
        reason,
    };
    if n == 0 {
        return Err(refused("gives the model nothing to read".into()));
    }
    if tokens.ids.len() > pretrained.max_len {
        let max = pretrained.max_len;
        return Err(refused(format!(
            "is longer than the model's {max} positions"
        )));
    }
    Ok(tokens)
}

/// Every attending layer's maps and head scores of `pretrained` on `tokens`.
pub fn read_text(pretrained: &Pretrained, tokens: Tokens) -> Result<TextReading> {
    let n = tokens.ids.len();
    let ids = Tensor::from_vec(tokens.ids.clone(), (1, n), pretrained.params.device())?;
    let mut reading = TextReading {
        tokens,
        attention: Vec::new(),
        layers: Vec::new(),
        scores: Vec::new(),
    };
    for (layer, weights) in pretrained.model.attention_weights(&ids)?.iter().enumerate() {
        let Some(weights) = weights else { continue };
        reading.scores.extend(head_scores(weights, layer, None)?);
        let causal = |map: Vec<Vec<f32>>| -> HeadMap {
            map.into_iter()
                .enumerate()
                .map(|(q, row)| row[..=q].to_vec())
                .collect()
        };
        let maps = weights.squeeze(0)?.to_vec3::<f32>()?;
        reading
            .attention
            .push(maps.into_iter().map(causal).collect());
        reading.layers.push(layer);
    }
    Ok(reading)
}

/// Every head's scores on the induction probe (TransformerLens's induction score and attnlab's
/// induction IoU beside the others); a probe longer than the model's positions is refused.
pub fn induction_scores(
    pretrained: &Pretrained,
    probe: &InductionProbe,
) -> Result<Vec<HeadScores>> {
    if probe.len() > pretrained.max_len {
        return Err(Error::Argument {
            name: "the induction probe".into(),
            value: format!("of {} tokens", probe.len()),
            reason: format!(
                "is longer than the model's {} positions: lower its half",
                pretrained.max_len
            ),
        });
    }
    let device = pretrained.params.device();
    let ids = Tensor::from_vec(probe.tokens(), (probe.rows, probe.len()), device)?;
    let mut scores = Vec::new();
    for (layer, weights) in pretrained.model.attention_weights(&ids)?.iter().enumerate() {
        if let Some(weights) = weights {
            scores.extend(head_scores(weights, layer, Some(probe))?);
        }
    }
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::checkpoint;

    fn gpt2() -> (Pretrained, TextTokenizer) {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/gpt2");
        let model = checkpoint::open(&folder, &Device::Cpu).unwrap();
        (model, TextTokenizer::open(&folder).unwrap())
    }

    /// Every layer and head, each row a distribution over the keys up to its query, and one
    /// score row per head.
    #[test]
    fn a_reading_has_every_heads_causal_rows() {
        let (model, tokenizer) = gpt2();
        let text = "The cat sat on the mat";
        let tokens = tokenise(&model, &tokenizer, text, true).unwrap();
        let plain = tokenise(&model, &tokenizer, text, false).unwrap();
        let first: Vec<u32> = model.first_token.into_iter().chain(plain.ids).collect();
        assert_eq!(
            tokens.ids, first,
            "the first token, where the model has one, then the text"
        );
        let n = tokens.ids.len();
        let reading = read_text(&model, tokens).unwrap();
        let (layers, heads) = (model.model_config.n_layers, model.model_config.n_heads);
        assert_eq!(reading.layers, (0..layers).collect::<Vec<_>>());
        assert_eq!(reading.scores.len(), layers * heads);
        for head in reading.attention.iter().flatten() {
            assert_eq!(head.len(), n);
            for (q, row) in head.iter().enumerate() {
                assert_eq!(row.len(), q + 1);
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-5, "row {q} sums to {sum}");
            }
        }
    }

    #[test]
    fn an_empty_or_too_long_text_is_refused_in_words() {
        let (model, tokenizer) = gpt2();
        for first in [false, true] {
            let empty = tokenise(&model, &tokenizer, "", first).unwrap_err();
            assert!(empty.to_string().contains("of 0 tokens"), "{empty}");
        }
        let long = "word ".repeat(model.max_len + 1);
        let long = tokenise(&model, &tokenizer, &long, false).unwrap_err();
        assert!(long.to_string().contains("positions"), "{long}");
    }
}
