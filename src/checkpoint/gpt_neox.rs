//! GPT-NeoX (`GPTNeoXForCausalLM`: Pythia): rotary positions on a fraction of each head
//! (`rotary_pct`, Pythia 0.25), pre-norm blocks with a parallel residual
//! (x + attn(ln₁(x)) + mlp(ln₂(x))), a fused qkv projection whose rows are interleaved per
//! head ([q_h | k_h | v_h] for each head h), exact GELU, an untied head without a bias. That is
//! attnlab's `attnlab` layout with `encoding.fraction` and `model.parallel_residual`; the
//! loader renames the tensors and regroups the qkv rows as attnlab's [q | k | v].

use candle_core::{DType, Device, Tensor};

use super::{Config, Pretrained, Tensors, assemble, block_parameter, no_parameter};
use crate::Result;
use crate::attention::{MechanismSpec, SoftmaxConfig};
use crate::encodings::{EncodingSpec, RopeConfig};
use crate::model::ModelConfig;

/// What `transformers` prefixes the model's names with (the head is `embed_out`).
const PREFIX: &str = "gpt_neox.";

pub(super) fn build(config: &Config, tensors: &Tensors, device: &Device) -> Result<Pretrained> {
    let keys = [
        &["hidden_size"][..],
        &["num_attention_heads"],
        &["num_hidden_layers"],
        &["intermediate_size"],
    ];
    let model = ModelConfig {
        parallel_residual: config.value(&["use_parallel_residual"]) != Some(&false.into()),
        ..config.transformer(keys, false)?
    };
    let positions = config.whole(&["max_position_embeddings"])?;
    let vocab = config.whole(&["vocab_size"])?;
    let encoding = EncodingSpec::Rope(RopeConfig {
        base: config.real(&["rotary_emb_base", "rope_theta"])?,
        fraction: config.real(&["rotary_pct", "partial_rotary_factor"])?,
    });
    let biased = config.value(&["attention_bias"]) != Some(&false.into());
    let (heads, head_dim) = (model.n_heads, model.head_dim());
    assemble(
        ("gpt_neox", model),
        (MechanismSpec::Softmax(SoftmaxConfig::default()), encoding),
        (vocab, positions),
        config,
        device,
        |name, dims| {
            let layout = Qkv { heads, head_dim };
            source((tensors, device), (layout, biased), name, dims)
        },
    )
}

/// The sizes the qkv rows are regrouped by.
#[derive(Clone, Copy)]
struct Qkv {
    heads: usize,
    head_dim: usize,
}

impl Qkv {
    /// Rows (or entries) grouped (head, q|k|v, channel) → (q|k|v, head, channel).
    fn regroup(self, x: &Tensor) -> Result<Tensor> {
        let rest: Vec<usize> = x.dims()[1..].to_vec();
        let grouped = [&[self.heads, 3, self.head_dim][..], &rest].concat();
        let regrouped = x.reshape(grouped)?.transpose(0, 1)?.contiguous()?;
        Ok(regrouped.reshape(x.dims())?)
    }
}

/// attnlab's parameter `name` of shape `dims` from GPT-NeoX's tensors (attention biases
/// zero where `attention_bias` is false).
fn source(
    (tensors, device): (&Tensors, &Device),
    (qkv, biased): (Qkv, bool),
    name: &str,
    dims: &[usize],
) -> Result<Tensor> {
    let get = |hf: &str| tensors.get((PREFIX, hf), dims);
    let zeros = || Ok(Tensor::zeros(dims, DType::F32, device)?);
    match name {
        "embedding.weight" => return get("embed_in.weight"),
        "head.weight" => return get("embed_out.weight"),
        "head.bias" => return zeros(),
        "final_norm.weight" => return get("final_layer_norm.weight"),
        "final_norm.bias" => return get("final_layer_norm.bias"),
        _ => {}
    }
    let (layer, rest) = block_parameter("GPT-NeoX", name)?;
    let at = |suffix: &str| format!("layers.{layer}.{suffix}");
    match rest {
        "norm.weight" => get(&at("input_layernorm.weight")),
        "norm.bias" => get(&at("input_layernorm.bias")),
        "attn.qkv.weight" => qkv.regroup(&get(&at("attention.query_key_value.weight"))?),
        "attn.qkv.bias" if biased => qkv.regroup(&get(&at("attention.query_key_value.bias"))?),
        "attn.out.weight" => get(&at("attention.dense.weight")),
        "attn.out.bias" if biased => get(&at("attention.dense.bias")),
        "attn.qkv.bias" | "attn.out.bias" => zeros(),
        "mlp_norm.weight" => get(&at("post_attention_layernorm.weight")),
        "mlp_norm.bias" => get(&at("post_attention_layernorm.bias")),
        "mlp.up.weight" => get(&at("mlp.dense_h_to_4h.weight")),
        "mlp.up.bias" => get(&at("mlp.dense_h_to_4h.bias")),
        "mlp.down.weight" => get(&at("mlp.dense_4h_to_h.weight")),
        "mlp.down.bias" => get(&at("mlp.dense_4h_to_h.bias")),
        _ => Err(no_parameter("GPT-NeoX", name)),
    }
}
