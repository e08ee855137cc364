//! GPT-2 (`GPT2LMHeadModel`): learned positions, pre-norm blocks with LayerNorm, fused
//! [q | k | v] with biases, scores scaled by 1/√d_head, an MLP with `gelu_new` (GELU's tanh
//! form), a final LayerNorm and the head tied to the embedding. That is attnlab's `attnlab`
//! layout with a learned encoding, softmax attention and `activation = "gelu-tanh"`; the only
//! remapping is of names, and the transpose of `Conv1D`'s (in, out) weights.

use candle_core::{Device, Tensor};

use super::{Config, Pretrained, Tensors, assemble, block_parameter, no_parameter};
use crate::attention::{MechanismSpec, SoftmaxConfig};
use crate::encodings::{EncodingSpec, LearnedConfig};
use crate::{Error, Result};

/// What `transformers` prefixes GPT-2's names with when it saves the model with its head.
const PREFIX: &str = "transformer.";

pub(super) fn build(config: &Config, tensors: &Tensors, device: &Device) -> Result<Pretrained> {
    let keys = [
        &["n_embd", "hidden_size"][..],
        &["n_head", "num_attention_heads"],
        &["n_layer", "num_hidden_layers"],
        &["n_inner", "intermediate_size"],
    ];
    let model = config.transformer(keys, true)?;
    let positions = config.whole(&["n_positions", "max_position_embeddings"])?;
    let vocab = config.whole(&["vocab_size"])?;
    let unscaled = config.value(&["scale_attn_weights"]) == Some(&false.into());
    let by_layer = config.value(&["scale_attn_by_inverse_layer_idx"]) == Some(&true.into());
    if unscaled || by_layer {
        return Err(Error::RunDir {
            message: "scores not scaled by 1/sqrt(d_head) (scale_attn_weights false or \
                      scale_attn_by_inverse_layer_idx true) are not supported"
                .into(),
            path: config.path.clone(),
        });
    }
    let attention = MechanismSpec::Softmax(SoftmaxConfig::default());
    let encoding = EncodingSpec::Learned(LearnedConfig::default());
    assemble(
        ("gpt2", model),
        (attention, encoding),
        (vocab, positions),
        config,
        device,
        |name, dims| source((tensors, device), name, dims),
    )
}

/// attnlab's parameter `name` of shape `dims` from GPT-2's tensors.
fn source((tensors, device): (&Tensors, &Device), name: &str, dims: &[usize]) -> Result<Tensor> {
    let get = |hf: &str, shape: &[usize]| tensors.get((PREFIX, hf), shape);
    // Conv1D keeps its weight as (in, out); attnlab's Linear as (out, in).
    let conv1d = |hf: &str| Ok::<_, Error>(get(hf, &[dims[1], dims[0]])?.t()?.contiguous()?);
    match name {
        "embedding.weight" => return get("wte.weight", dims),
        "pos_embedding" => return get("wpe.weight", dims),
        // The tied head has no bias in GPT-2: attnlab's is zero.
        "head.bias" => return Ok(Tensor::zeros(dims, candle_core::DType::F32, device)?),
        "final_norm.weight" => return get("ln_f.weight", dims),
        "final_norm.bias" => return get("ln_f.bias", dims),
        _ => {}
    }
    let (layer, rest) = block_parameter("GPT-2", name)?;
    let h = format!("h.{layer}");
    match rest {
        "norm.weight" => get(&format!("{h}.ln_1.weight"), dims),
        "norm.bias" => get(&format!("{h}.ln_1.bias"), dims),
        "attn.qkv.weight" => conv1d(&format!("{h}.attn.c_attn.weight")),
        "attn.qkv.bias" => get(&format!("{h}.attn.c_attn.bias"), dims),
        "attn.out.weight" => conv1d(&format!("{h}.attn.c_proj.weight")),
        "attn.out.bias" => get(&format!("{h}.attn.c_proj.bias"), dims),
        "mlp_norm.weight" => get(&format!("{h}.ln_2.weight"), dims),
        "mlp_norm.bias" => get(&format!("{h}.ln_2.bias"), dims),
        "mlp.up.weight" => conv1d(&format!("{h}.mlp.c_fc.weight")),
        "mlp.up.bias" => get(&format!("{h}.mlp.c_fc.bias"), dims),
        "mlp.down.weight" => conv1d(&format!("{h}.mlp.c_proj.weight")),
        "mlp.down.bias" => get(&format!("{h}.mlp.c_proj.bias"), dims),
        _ => Err(no_parameter("GPT-2", name)),
    }
}
