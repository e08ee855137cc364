//! Pretrained models from a Hugging Face folder (`config.json`, `model.safetensors`), built as
//! attnlab's own [`Transformer`] so that every view and analysis works on them unchanged
//! (issue 30; ../shared/reference/mixers-mad-checkpoints.md §3). Each family maps its tensors
//! onto attnlab's parameter names; what is common (reading the config under every spelling
//! `transformers` has used, the tensors, the checks) is here.
//!
//! Families: [`gpt2`] (GPT-2), [`gpt_neo`] (GPT-Neo, TinyStories), [`gpt_neox`] (GPT-NeoX,
//! Pythia), each checked against `transformers` on the fixtures `scripts/make_hf_fixtures.py`
//! made (tests/fixtures/hf).

mod gpt2;
mod gpt_neo;
mod gpt_neox;
mod tokenizer;

pub use tokenizer::{TextTokenizer, Tokens};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::attention::MechanismSpec;
use crate::encodings::{EncodingShape, EncodingSpec};
use crate::model::{Activation, Build, Layout, MixerKind, ModelConfig, Transformer};
use crate::ops::Precision;
use crate::params::Params;
use crate::{Error, Result};

/// A pretrained model as attnlab builds it: what its preset would say, and the model.
pub struct Pretrained {
    /// The family, as `config.json`'s `model_type` names it (`gpt2`).
    pub family: String,
    pub model_config: ModelConfig,
    pub mechanism: MechanismSpec,
    pub encoding: EncodingSpec,
    pub vocab_size: usize,
    /// The longest input its positions allow.
    pub max_len: usize,
    /// The beginning-of-sequence token (`bos_token_id`), which TransformerLens puts before
    /// every input; `None` when the config has none within the vocabulary.
    pub first_token: Option<u32>,
    pub params: Params,
    pub model: Transformer,
}

impl Pretrained {
    /// The same weights under another positional encoding (an inference-time rotary scaling)
    /// for inputs up to `max_len` tokens: the length experiments rebuild the model this way
    /// at every evaluation length.
    pub fn with_encoding(&self, encoding: &EncodingSpec, max_len: usize) -> Result<Transformer> {
        let params = Params::to_be_loaded(self.params.device());
        let model = Transformer::new(
            &self.model_config,
            &self.mechanism,
            encoding,
            self.vocab_size,
            max_len,
            Precision::F32,
            &params,
        )?;
        let weights: HashMap<String, Tensor> = self
            .params
            .vars()
            .into_iter()
            .map(|(name, var)| (name, var.as_tensor().clone()))
            .collect();
        for (name, var) in params.vars() {
            let weight = weights.get(&name).ok_or_else(|| {
                Error::Internal(format!(
                    "{} rebuilt with a parameter {name} it lacks",
                    self.family
                ))
            })?;
            var.set(weight)?;
        }
        Ok(model)
    }
}

/// The model in Hugging Face folder `folder`, on `device`.
pub fn open(folder: &Path, device: &Device) -> Result<Pretrained> {
    let config = Config::read(folder)?;
    let tensors = Tensors::read(folder, device)?;
    match config.string(&["model_type"])?.as_str() {
        "gpt_neox" => gpt_neox::build(&config, &tensors, device),
        "gpt2" => gpt2::build(&config, &tensors, device),
        "gpt_neo" => gpt_neo::build(&config, &tensors, device),
        other => Err(Error::unsupported(
            format!("the model type '{other}' of {}", config.path.display()),
            "attnlab opens gpt2, gpt_neo and gpt_neox folders",
        )),
    }
}

/// `config.json`, read under every spelling of a setting.
struct Config {
    path: PathBuf,
    json: serde_json::Value,
}

impl Config {
    fn read(folder: &Path) -> Result<Self> {
        let path = folder.join("config.json");
        let text = crate::io::read_text(&path, "the model's config", crate::io::MAX_TEXT_FILE)?;
        let json = serde_json::from_str(&text).map_err(|e| Error::RunDir {
            message: format!("config.json is not JSON ({e})"),
            path: path.clone(),
        })?;
        Ok(Self { path, json })
    }

    /// The first of `keys` present (the spellings of one setting across `transformers`
    /// versions).
    fn value(&self, keys: &[&str]) -> Option<&serde_json::Value> {
        keys.iter()
            .find_map(|k| self.json.get(k).filter(|v| !v.is_null()))
    }

    fn missing(&self, keys: &[&str]) -> Error {
        Error::RunDir {
            message: format!("config.json has no {}", keys.join(" or ")),
            path: self.path.clone(),
        }
    }

    fn whole(&self, keys: &[&str]) -> Result<usize> {
        let value = self.value(keys).ok_or_else(|| self.missing(keys))?;
        value
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| Error::RunDir {
                message: format!("config.json's {} is {value}, not a whole number", keys[0]),
                path: self.path.clone(),
            })
    }

    /// A whole number that may be left out (`null` or absent): `default` then.
    fn whole_or(&self, keys: &[&str], default: usize) -> Result<usize> {
        match self.value(keys) {
            None => Ok(default),
            Some(_) => self.whole(keys),
        }
    }

    /// A GPT-style model's config: width, heads, layers and MLP width read under each
    /// family's `[width, heads, layers, inner]` spellings (the MLP 4 × the width where the
    /// config leaves it out), checked to make whole heads and a whole MLP ratio; attnlab's
    /// layout, its activation, attention in every layer, the head tied or not.
    fn transformer(&self, keys: [&[&str]; 4], tie_embeddings: bool) -> Result<ModelConfig> {
        let [width, heads_keys, layers_keys, inner_keys] = keys;
        let (d, heads) = (self.whole(width)?, self.whole(heads_keys)?);
        let inner = self.whole_or(inner_keys, 4 * d)?;
        if heads == 0 || d == 0 || !d.is_multiple_of(heads) || !inner.is_multiple_of(d) {
            return Err(Error::RunDir {
                message: format!(
                    "{} {d}, {} {heads} and {} {inner} do not make whole heads and a whole MLP \
                     ratio",
                    width[0], heads_keys[0], inner_keys[0]
                ),
                path: self.path.clone(),
            });
        }
        Ok(ModelConfig {
            d_model: d,
            n_layers: self.whole(layers_keys)?,
            n_heads: heads,
            mlp_ratio: inner / d,
            activation: self.activation()?,
            mixers: vec![MixerKind::Attention],
            tie_embeddings,
            layout: Layout::Attnlab,
            ..ModelConfig::default()
        })
    }

    /// The MLP's activation (`activation_function` or `hidden_act`).
    fn activation(&self) -> Result<Activation> {
        match self
            .string(&["activation_function", "hidden_act"])?
            .as_str()
        {
            "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
            "gelu" => Ok(Activation::Gelu),
            other => Err(Error::RunDir {
                message: format!(
                    "activation {other} is not one attnlab has (gelu, gelu_new, \
                     gelu_pytorch_tanh)"
                ),
                path: self.path.clone(),
            }),
        }
    }

    fn real(&self, keys: &[&str]) -> Result<f64> {
        let value = self.value(keys).ok_or_else(|| self.missing(keys))?;
        value.as_f64().ok_or_else(|| Error::RunDir {
            message: format!("config.json's {} is {value}, not a number", keys[0]),
            path: self.path.clone(),
        })
    }

    fn string(&self, keys: &[&str]) -> Result<String> {
        let value = self.value(keys).ok_or_else(|| self.missing(keys))?;
        value
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::RunDir {
                message: format!("config.json's {} is {value}, not text", keys[0]),
                path: self.path.clone(),
            })
    }
}

/// The folder's weights by name, as f32 (F16 and BF16 checkpoints are widened).
struct Tensors {
    path: PathBuf,
    by_name: HashMap<String, Tensor>,
}

impl Tensors {
    /// `model.safetensors`, else `pytorch_model.bin` (PyTorch's pickle, read by candle's
    /// reader, which builds tensors and runs no code), each whole or sharded (its
    /// `.index.json` names the shard of every tensor, as `transformers` saves models over its
    /// shard size).
    fn read(folder: &Path, device: &Device) -> Result<Self> {
        for (file, pickle) in [
            ("model.safetensors", false),
            ("model.safetensors.index.json", false),
            ("pytorch_model.bin", true),
            ("pytorch_model.bin.index.json", true),
        ] {
            let path = folder.join(file);
            if !path.exists() {
                continue;
            }
            let files = match file.ends_with(".index.json") {
                true => shard_files(&path)?,
                false => vec![path.clone()],
            };
            let mut by_name = HashMap::new();
            for file in files {
                by_name.extend(read_weights(&file, pickle, device)?);
            }
            return Ok(Self { path, by_name });
        }
        Err(Error::RunDir {
            message: "no model.safetensors or pytorch_model.bin (whole, or sharded with its \
                      .index.json) in the model folder"
                .into(),
            path: folder.to_path_buf(),
        })
    }

    /// Tensor `name` (or `prefix` + `name`, as a model saved with its LM head names them) of
    /// `shape`, as f32.
    fn get(&self, (prefix, name): (&str, &str), shape: &[usize]) -> Result<Tensor> {
        let tensor = self
            .by_name
            .get(name)
            .or_else(|| self.by_name.get(&format!("{prefix}{name}")))
            .ok_or_else(|| Error::RunDir {
                message: format!("the weights have no tensor {name}"),
                path: self.path.clone(),
            })?;
        if tensor.dims() != shape {
            return Err(Error::RunDir {
                message: format!(
                    "tensor {name} has shape {:?}, config.json says {shape:?}",
                    tensor.dims()
                ),
                path: self.path.clone(),
            });
        }
        Ok(tensor.to_dtype(DType::F32)?)
    }
}

/// Every tensor of one weights file, on `device`.
fn read_weights(path: &Path, pickle: bool, device: &Device) -> Result<HashMap<String, Tensor>> {
    let unreadable = |e: candle_core::Error| Error::RunDir {
        message: format!("cannot read the weights ({e})"),
        path: path.to_path_buf(),
    };
    if !pickle {
        return crate::params::load_tensors(path, "the weights", device);
    }
    // The pickle reader opens the file itself: refuse a FIFO or a device first.
    crate::io::regular_file_len(path, "cannot read the weights", u64::MAX)?;
    candle_core::pickle::read_all(path)
        .map_err(unreadable)?
        .into_iter()
        .map(|(name, t)| Ok((name, t.to_device(device)?)))
        .collect()
}

/// The shard files a sharded checkpoint's index names (its `weight_map`'s values), each once,
/// beside the index; one that is missing is refused by name.
fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = crate::io::read_text(index, "shard index", crate::io::MAX_TEXT_FILE)?;
    let bad = |message: String| Error::RunDir {
        message,
        path: index.to_path_buf(),
    };
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| bad(format!("the shard index is not JSON ({e})")))?;
    let map = json["weight_map"]
        .as_object()
        .ok_or_else(|| bad("the shard index has no weight_map".into()))?;
    let names: std::collections::BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
    let folder = index.parent().unwrap_or(Path::new("."));
    names
        .into_iter()
        .map(|name| {
            let shard = folder.join(name);
            match shard.is_file() {
                true => Ok(shard),
                false => Err(bad(format!("the shard {name} the index names is missing"))),
            }
        })
        .collect()
}

/// The model `config` describes with every parameter set by `source` (attnlab's name and
/// shape → the checkpoint's value); one left unset is an internal error.
fn assemble(
    (family, model_config): (&str, ModelConfig),
    (mechanism, encoding): (MechanismSpec, EncodingSpec),
    (vocab_size, max_len): (usize, usize),
    config: &Config,
    device: &Device,
    source: impl Fn(&str, &[usize]) -> Result<Tensor>,
) -> Result<Pretrained> {
    check_buildable(config, (&model_config, &mechanism), (&encoding, max_len))?;
    let params = Params::to_be_loaded(device);
    let model = Transformer::new(
        &model_config,
        &mechanism,
        &encoding,
        vocab_size,
        max_len,
        Precision::F32,
        &params,
    )?;
    for (name, var) in params.vars() {
        var.set(&source(&name, var.dims())?)?;
    }
    let first_token = config
        .value(&["bos_token_id"])
        .and_then(serde_json::Value::as_u64)
        .filter(|&id| (id as usize) < vocab_size)
        .map(|id| id as u32);
    Ok(Pretrained {
        family: family.to_string(),
        model_config,
        mechanism,
        encoding,
        vocab_size,
        max_len,
        first_token,
        params,
        model,
    })
}

/// (layer, the rest) of a block's parameter name `blocks.{layer}.{rest}`.
fn block_parameter<'a>(family: &str, name: &'a str) -> Result<(&'a str, &'a str)> {
    name.strip_prefix("blocks.")
        .and_then(|rest| rest.split_once('.'))
        .ok_or_else(|| no_parameter(family, name))
}

/// A parameter of attnlab's model that `family` has no tensor for: a loader out of step with
/// the model it builds.
fn no_parameter(family: &str, name: &str) -> Error {
    Error::Internal(format!("{family} has no parameter for {name}"))
}

/// Refuses what attnlab would build otherwise than the config says: LayerNorm's ε other than
/// its 1e-5, a `rope_scaling` (not read yet), and a model, mechanism or encoding its own checks
/// refuse (e.g. a `rotary_pct` that rotates fewer than 2 channels, a `window_size` of 0).
fn check_buildable(
    config: &Config,
    (model, mechanism): (&ModelConfig, &MechanismSpec),
    (encoding, max_len): (&EncodingSpec, usize),
) -> Result<()> {
    let refuse = |message: String| Error::RunDir {
        message,
        path: config.path.clone(),
    };
    let eps = config.value(&["layer_norm_epsilon", "layer_norm_eps"]);
    if let Some(eps) = eps.filter(|e| e.as_f64().is_none_or(|e| (e - 1e-5).abs() > 1e-12)) {
        return Err(refuse(format!(
            "layer_norm_eps {eps} is not attnlab's LayerNorm epsilon, 1e-5"
        )));
    }
    if let Some(scaling) = config.value(&["rope_scaling"]) {
        return Err(refuse(format!("rope_scaling {scaling} is not read yet")));
    }
    let shape = EncodingShape {
        d_model: model.d_model,
        n_heads: model.n_heads,
        qk_dim: model.head_dim(),
        max_len,
        embedding_std: Build::embedding_std(model.layout),
    };
    model
        .validate()
        .and_then(|()| mechanism.validate(max_len))
        .and_then(|()| encoding.validate(&shape))
        .map_err(|e| refuse(format!("attnlab cannot build this model: {e}")))
}
