//! GPT-Neo (`GPTNeoForCausalLM`; the TinyStories models): GPT-2's block with separate q, k and v
//! projections without biases, scores not scaled by 1/√d_head, and layers alternating between
//! global attention and a local window (`attention_layers`, `window_size`: query i sees keys
//! j with i − j < window, attnlab's `window` convention). That is GPT-2's build with softmax's
//! `unscaled`, `window` and `window_layers` settings; its weights are `nn.Linear`'s (out, in),
//! as attnlab's.

use candle_core::{DType, Device, Tensor};

use super::{Config, Pretrained, Tensors, assemble, block_parameter, no_parameter};
use crate::attention::{MechanismSpec, SoftmaxConfig, WindowLayers};
use crate::encodings::{EncodingSpec, LearnedConfig};
use crate::{Error, Result};

/// What `transformers` prefixes GPT-Neo's names with when it saves the model with its head.
const PREFIX: &str = "transformer.";

pub(super) fn build(config: &Config, tensors: &Tensors, device: &Device) -> Result<Pretrained> {
    let keys = [
        &["hidden_size"][..],
        &["num_heads", "num_attention_heads"],
        &["num_layers", "num_hidden_layers"],
        &["intermediate_size"],
    ];
    let model = config.transformer(keys, true)?;
    let positions = config.whole(&["max_position_embeddings"])?;
    let vocab = config.whole(&["vocab_size"])?;
    let window_layers = local_layers(config, model.n_layers)?;
    let window = match window_layers {
        Some(_) => Some(config.whole(&["window_size"])?),
        None => None,
    };
    let attention = MechanismSpec::Softmax(SoftmaxConfig {
        window,
        window_layers: window_layers.unwrap_or_default(),
        unscaled: true,
    });
    let encoding = EncodingSpec::Learned(LearnedConfig::default());
    assemble(
        ("gpt_neo", model),
        (attention, encoding),
        (vocab, positions),
        config,
        device,
        |name, dims| source((tensors, device), name, dims),
    )
}

/// Which layers `attention_layers` makes local: none (`None`), all, or every other one; another
/// pattern is refused, naming it.
fn local_layers(config: &Config, layers: usize) -> Result<Option<WindowLayers>> {
    let kinds: Vec<String> = match config.value(&["attention_layers"]) {
        Some(serde_json::Value::Array(kinds)) => kinds
            .iter()
            .map(|k| k.as_str().unwrap_or_default().to_string())
            .collect(),
        _ => return Err(config.missing(&["attention_layers"])),
    };
    let local: Vec<bool> = kinds.iter().map(|k| k == "local").collect();
    let unknown = kinds
        .iter()
        .find(|k| !["global", "local"].contains(&k.as_str()));
    let pattern = |f: fn(usize) -> bool| local.iter().enumerate().all(|(i, &l)| l == f(i));
    let choice = if let Some(unknown) = unknown {
        Err(format!(
            "attention type '{unknown}' (global and local are read)"
        ))
    } else if local.len() != layers {
        Err(format!(
            "{} attention_layers for {layers} layers",
            local.len()
        ))
    } else if local.iter().all(|&l| !l) {
        Ok(None)
    } else if pattern(|_| true) {
        Ok(Some(WindowLayers::All))
    } else if pattern(|i| i % 2 == 1) {
        Ok(Some(WindowLayers::Odd))
    } else if pattern(|i| i % 2 == 0) {
        Ok(Some(WindowLayers::Even))
    } else {
        Err(format!(
            "attention_layers {kinds:?}: local layers are read on all, odd or even layers"
        ))
    };
    choice.map_err(|message| Error::RunDir {
        message,
        path: config.path.clone(),
    })
}

/// attnlab's parameter `name` of shape `dims` from GPT-Neo's tensors.
fn source((tensors, device): (&Tensors, &Device), name: &str, dims: &[usize]) -> Result<Tensor> {
    let get = |hf: &str, shape: &[usize]| tensors.get((PREFIX, hf), shape);
    let zeros = || Ok(Tensor::zeros(dims, DType::F32, device)?);
    match name {
        "embedding.weight" => return get("wte.weight", dims),
        "pos_embedding" => return get("wpe.weight", dims),
        // The tied head has no bias in GPT-Neo: attnlab's is zero.
        "head.bias" => return zeros(),
        "final_norm.weight" => return get("ln_f.weight", dims),
        "final_norm.bias" => return get("ln_f.bias", dims),
        _ => {}
    }
    let (layer, rest) = block_parameter("GPT-Neo", name)?;
    let h = format!("h.{layer}");
    match rest {
        "norm.weight" => get(&format!("{h}.ln_1.weight"), dims),
        "norm.bias" => get(&format!("{h}.ln_1.bias"), dims),
        "attn.qkv.weight" => {
            let block = |which: &str| {
                get(
                    &format!("{h}.attn.attention.{which}.weight"),
                    &[dims[0] / 3, dims[1]],
                )
            };
            Ok(Tensor::cat(
                &[block("q_proj")?, block("k_proj")?, block("v_proj")?],
                0,
            )?)
        }
        // q, k and v have no biases.
        "attn.qkv.bias" => zeros(),
        "attn.out.weight" => get(&format!("{h}.attn.attention.out_proj.weight"), dims),
        "attn.out.bias" => get(&format!("{h}.attn.attention.out_proj.bias"), dims),
        "mlp_norm.weight" => get(&format!("{h}.ln_2.weight"), dims),
        "mlp_norm.bias" => get(&format!("{h}.ln_2.bias"), dims),
        "mlp.up.weight" => get(&format!("{h}.mlp.c_fc.weight"), dims),
        "mlp.up.bias" => get(&format!("{h}.mlp.c_fc.bias"), dims),
        "mlp.down.weight" => get(&format!("{h}.mlp.c_proj.weight"), dims),
        "mlp.down.bias" => get(&format!("{h}.mlp.c_proj.bias"), dims),
        _ => Err(no_parameter("GPT-Neo", name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(kinds: &[&str]) -> Config {
        Config {
            path: "config.json".into(),
            json: serde_json::json!({ "attention_layers": kinds }),
        }
    }

    /// GPT-Neo's patterns map onto `window_layers`; another is refused, naming it.
    #[test]
    fn attention_layers_map_onto_the_windowed_layers() {
        let local = |kinds: &[&str]| local_layers(&config(kinds), kinds.len());
        assert_eq!(local(&["global", "global"]).unwrap(), None);
        assert_eq!(
            local(&["global", "local"]).unwrap(),
            Some(WindowLayers::Odd)
        );
        assert_eq!(
            local(&["local", "global", "local"]).unwrap(),
            Some(WindowLayers::Even)
        );
        assert_eq!(local(&["local", "local"]).unwrap(), Some(WindowLayers::All));
        let mixed = local(&["local", "local", "global"])
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("all, odd or even"), "{mixed}");
        let unknown = local(&["global", "sparse"]).unwrap_err().to_string();
        assert!(unknown.contains("'sparse'"), "{unknown}");
        let short = local_layers(&config(&["global"]), 2)
            .unwrap_err()
            .to_string();
        assert!(short.contains("1 attention_layers for 2 layers"), "{short}");
    }
}
