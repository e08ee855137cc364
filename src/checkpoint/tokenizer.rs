//! A model folder's `tokenizer.json`, read by Hugging Face's `tokenizers` (the library
//! `transformers` itself calls), so that a text reaches the model as the ids it was trained on.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Error, Result};

/// A folder's tokenizer.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

/// A text as a model reads it: its ids, and each token as text (what it decodes to alone, so a
/// byte-level BPE's "Ġcat" reads " cat").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tokens {
    pub ids: Vec<u32>,
    pub tokens: Vec<String>,
}

impl Tokens {
    /// The first `most` tokens numbered, `0 "The"  1 " cat" …`, for captions and reports, and
    /// how many more there are.
    pub fn numbered(&self, most: usize) -> String {
        let tokens = self.tokens.iter().enumerate().take(most);
        let numbered: Vec<String> = tokens.map(|(i, t)| format!("{i} {t:?}")).collect();
        match self.tokens.len().saturating_sub(most) {
            0 => numbered.join("  "),
            more => format!("{}  … ({more} more)", numbered.join("  ")),
        }
    }
}

impl TextTokenizer {
    /// `folder`/tokenizer.json, or the error naming it.
    pub fn open(folder: &Path) -> Result<Self> {
        let path = folder.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::RunDir {
                message: "no tokenizer.json: a text input needs the model's tokenizer (download \
                          it with the model)"
                    .into(),
                path,
            });
        }
        // `tokenizers` opens the file itself: refuse a FIFO or a device first.
        crate::io::regular_file_len(&path, "cannot read tokenizer.json", u64::MAX)?;
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::RunDir {
            message: format!("tokenizer.json cannot be read by `tokenizers` ({e})"),
            path: path.clone(),
        })?;
        Ok(Self { inner, path })
    }

    /// `text`'s tokens, after `first` where given (the beginning-of-sequence token, as
    /// TransformerLens prepends it), each id checked against the model's `vocab`.
    pub fn encode(&self, text: &str, first: Option<u32>, vocab: usize) -> Result<Tokens> {
        let encoding = self.inner.encode(text, false).map_err(|e| Error::RunDir {
            message: format!("the tokenizer failed on the text ({e})"),
            path: self.path.clone(),
        })?;
        let ids: Vec<u32> = first
            .into_iter()
            .chain(encoding.get_ids().to_vec())
            .collect();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::RunDir {
                message: format!("the tokenizer gives id {bad}, past the model's {vocab} tokens"),
                path: self.path.clone(),
            });
        }
        let tokens = ids.iter().map(|&id| self.token_text(id)).collect();
        Ok(Tokens { ids, tokens })
    }

    /// Token `id` decoded alone, or its vocabulary entry where that decodes to nothing.
    fn token_text(&self, id: u32) -> String {
        match self.inner.decode(&[id], false) {
            Ok(text) if !text.is_empty() => text,
            _ => self
                .inner
                .id_to_token(id)
                .unwrap_or_else(|| format!("<{id}>")),
        }
    }
}
