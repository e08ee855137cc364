//! The whole model, small to large: blocks, then the transformer (nanoGPT's order).

use std::sync::Arc;

use candle_core::Tensor;

use super::autoencoder::AutoEncoder;
use super::{
    Build, Embedding, Head, HeadAblation, Layout, Linear, MixerKind, Mlp, ModelConfig,
    MultiHeadAttention, Norm, PrevToken, ShortConv, gather_rows,
};
use crate::Result;
use crate::attention::{Attention, MechanismShape, MechanismSpec};
use crate::encodings::{Encoding, EncodingShape, EncodingSpec, Family, NoEncoding};
use crate::ops::{Precision, dropout, mix_seed};
use crate::params::Params;

enum Mixer {
    Attention(MultiHeadAttention),
    ShortConv(ShortConv),
    PrevToken(PrevToken),
}

/// What a block adds after its mixer (zoology's "state mixer").
enum StateMixer {
    /// Nothing (the attnlab layout without an MLP).
    None,
    /// x + norm(x): zoology's Identity state mixer, applied to its LayerNorm's output.
    Norm(Norm),
    /// x + mlp(norm(x)).
    Mlp(Norm, Mlp),
}

/// Pre-norm residual block: x + mixer(norm(x)), then the state mixer; with a parallel
/// residual (GPT-NeoX's `use_parallel_residual`) x + mixer(norm₁(x)) + mlp(norm₂(x)).
struct Block {
    norm: Norm,
    mixer: Mixer,
    state: StateMixer,
    parallel: bool,
}

impl Block {
    /// x + mixer(norm(x)), and the attention if the mixer is attention and `chunk` is `None`;
    /// with `Some(chunk)`, attention runs over blocks of `chunk` queries and is not returned.
    fn mix(&self, x: &Tensor, chunk: Option<usize>) -> Result<(Tensor, Option<Attention>)> {
        let h = self.norm.forward(x)?;
        let (y, attention) = match &self.mixer {
            Mixer::Attention(mha) => match chunk {
                Some(chunk) => (mha.forward_blocks(&h, chunk)?, None),
                None => {
                    let (y, attention) = mha.forward(&h)?;
                    (y, Some(attention))
                }
            },
            Mixer::ShortConv(conv) => (conv.forward(&h)?, None),
            Mixer::PrevToken(shift) => (shift.forward(&h)?, None),
        };
        Ok(((x + y)?, attention))
    }

    /// x + mixer(norm(x)) for training: attention without its weights where the mechanism
    /// can ([`MultiHeadAttention::forward_output`]), with dropout when `dropout_seeds` are given.
    fn mix_output(&self, x: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        let h = self.norm.forward(x)?;
        let y = match &self.mixer {
            Mixer::Attention(mha) => mha.forward_output(&h, dropout_seeds)?,
            Mixer::ShortConv(conv) => conv.forward(&h)?,
            Mixer::PrevToken(shift) => shift.forward(&h)?,
        };
        Ok((x + y)?)
    }

    /// [`Self::mix`] at the flat positions `rows` (b·T + t) only: (R, D). The mixer still
    /// reads every position; its output projection and the residual skip the others.
    fn mix_rows(&self, x: &Tensor, rows: &Tensor, dropout_seeds: Option<&[u64]>) -> Result<Tensor> {
        let h = self.norm.forward(x)?;
        let y = match &self.mixer {
            Mixer::Attention(mha) => mha.forward_rows(&h, rows, dropout_seeds)?,
            Mixer::ShortConv(conv) => gather_rows(&conv.forward(&h)?, rows)?,
            Mixer::PrevToken(shift) => gather_rows(&shift.forward(&h)?, rows)?,
        };
        Ok((gather_rows(x, rows)? + y)?)
    }

    /// The state mixer on `x`, the mixer's output with its residual: x, x + norm(x) or
    /// x + mlp(norm(x)), or with a parallel residual x + mlp(norm(input)), `input` the block's
    /// input at the same rows (read only then). Works on (B, T, D) or on gathered rows (R, D).
    fn feed_forward(&self, x: Tensor, input: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        match &self.state {
            StateMixer::None => Ok(x),
            StateMixer::Norm(norm) => Ok((&x + norm.forward(&x)?)?),
            StateMixer::Mlp(norm, mlp) if self.parallel => {
                Ok((&x + mlp.forward(&norm.forward(&input()?)?)?)?)
            }
            StateMixer::Mlp(norm, mlp) => Ok((&x + mlp.forward(&norm.forward(&x)?)?)?),
        }
    }
}

/// What a full forward pass returns.
pub struct Forward {
    /// (B, T, V)
    pub logits: Tensor,
    /// Per layer: the attention of attention layers, `None` for convolution layers.
    pub attention: Vec<Option<Attention>>,
}

/// What turns the last block's output into logits ([`Head`]).
enum Unembedding {
    /// The final norm, then the LM head at each position.
    Lm {
        final_norm: Norm,
        head: Linear,
    },
    AutoEncoder(AutoEncoder),
}

impl Unembedding {
    /// Logits (B, T, V) at every position of the blocks' output x (B, T, D).
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Lm { final_norm, head } => head.forward(&final_norm.forward(x)?),
            Self::AutoEncoder(autoencoder) => autoencoder.logits(x),
        }
    }
}

/// Decoder-only transformer.
pub struct Transformer {
    embedding: Embedding,
    input_encoding: Arc<dyn Encoding>,
    blocks: Vec<Block>,
    unembedding: Unembedding,
    /// Dropout on the embeddings while training.
    embed_dropout: f64,
}

/// The dropout seed of one site (the embeddings, then each layer) of one training step.
fn site_seed(step_seed: u64, site: usize) -> u64 {
    mix_seed(step_seed.wrapping_add(site as u64))
}

impl Transformer {
    /// Builds the model; every parameter is created in `params`. `precision` is how its matrix
    /// products compute (see [`Precision`]).
    pub fn new(
        config: &ModelConfig,
        mechanism: &MechanismSpec,
        encoding: &EncodingSpec,
        vocab_size: usize,
        max_len: usize,
        precision: Precision,
        params: &Params,
    ) -> Result<Self> {
        let d = config.d_model;
        let qk_dim = mechanism.qk_dim(config.head_dim());
        let enc_shape = EncodingShape {
            d_model: d,
            n_heads: config.n_heads,
            qk_dim,
            max_len,
            embedding_std: Build::embedding_std(config.layout),
        };
        // Absolute encodings act once on the input; the others act inside every attention
        // layer, shared by all of them unless the encoding is per layer.
        let (input_encoding, shared): (Arc<dyn Encoding>, Option<Arc<dyn Encoding>>) =
            match encoding.family() {
                Family::Absolute => (
                    encoding.build(&enc_shape, params)?,
                    Some(Arc::new(NoEncoding)),
                ),
                _ if encoding.is_per_layer() => (Arc::new(NoEncoding), None),
                _ => (
                    Arc::new(NoEncoding),
                    Some(encoding.build(&enc_shape, params)?),
                ),
            };
        let layer_encoding = |layer: usize| -> Result<Arc<dyn Encoding>> {
            match &shared {
                Some(shared) => Ok(shared.clone()),
                None => encoding.build(&enc_shape, &params.pp(format!("blocks.{layer}.pos"))),
            }
        };
        let mech_shape = MechanismShape {
            n_heads: config.n_heads,
            qk_dim,
            head_dim: config.head_dim(),
            max_len,
            precision,
        };
        let build = Build {
            precision,
            layout: config.layout,
            n_layers: config.n_layers,
            autoencoder: config.head == Head::Autoencoder,
        };
        // zoology's MHA has attention dropout; its other mixers have none.
        let attention_dropout = match mechanism {
            MechanismSpec::Softmax(_) => config.attention_dropout(),
            _ => 0.0,
        };
        let blocks = (0..config.n_layers)
            .map(|layer| {
                let p = params.pp(format!("blocks.{layer}"));
                let mixer = match config.mixer(layer) {
                    MixerKind::Attention => Mixer::Attention(
                        MultiHeadAttention::new(
                            d,
                            config.n_heads,
                            qk_dim,
                            mechanism
                                .at_layer(layer)
                                .build(&mech_shape, &p.pp("attn"))?,
                            layer_encoding(layer)?,
                            &build,
                            &p.pp("attn"),
                        )?
                        .with_attention_dropout(attention_dropout),
                    ),
                    MixerKind::ShortConv => Mixer::ShortConv(ShortConv::new(
                        d,
                        config.conv_kernel,
                        &build,
                        &p.pp("conv"),
                    )?),
                    MixerKind::PrevToken => Mixer::PrevToken(PrevToken),
                };
                let state_norm = || Norm::new(d, config.layout, &p.pp("mlp_norm"));
                let state = match (config.mlp_ratio, config.layout) {
                    (0, Layout::Attnlab | Layout::Mad) => StateMixer::None,
                    (0, Layout::Zoology) => StateMixer::Norm(state_norm()?),
                    (_, _) => StateMixer::Mlp(
                        state_norm()?,
                        Mlp::new(
                            (d, config.mlp_hidden()),
                            config.activation,
                            &build,
                            &p.pp("mlp"),
                        )?,
                    ),
                };
                Ok(Block {
                    norm: Norm::new(d, config.layout, &p.pp("norm"))?,
                    mixer,
                    state,
                    parallel: config.parallel_residual,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embedding = Embedding::new(vocab_size, d, &build, &params.pp("embedding"))?;
        if build.autoencoder {
            let autoencoder = AutoEncoder::new((d, vocab_size, max_len), &build, params)?;
            return Ok(Self {
                embedding,
                input_encoding,
                blocks,
                unembedding: Unembedding::AutoEncoder(autoencoder),
                embed_dropout: config.embed_dropout(),
            });
        }
        let head = match config.layout {
            // zoology's LanguageModel: lm_head shares the embedding and has no bias.
            Layout::Zoology => Linear::from_weight(embedding.weight().clone(), None, precision),
            Layout::Attnlab | Layout::Mad if config.tie_embeddings => {
                let bias =
                    params.get("head.bias", vocab_size, crate::params::Init::Constant(0.0))?;
                Linear::from_weight(embedding.weight().clone(), Some(bias), precision)
            }
            Layout::Attnlab | Layout::Mad => {
                build.linear((d, vocab_size), false, &params.pp("head"))?
            }
        };
        let final_norm = Norm::new(d, config.layout, &params.pp("final_norm"))?;
        Ok(Self {
            embedding,
            input_encoding,
            blocks,
            unembedding: Unembedding::Lm { final_norm, head },
            embed_dropout: config.embed_dropout(),
        })
    }

    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.input_encoding
            .add_to_input(&self.embedding.forward(ids)?)
    }

    /// Logits (R, V) at the flat positions `rows` (b·T + t) only, without dropout: the
    /// evaluation path.
    pub fn logits_at(&self, ids: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.logits_rows(ids, rows, None)
    }

    /// [`Self::logits_at`] for a training step: with the model's dropout, its masks drawn from
    /// the step's seed, one per replica (one for a lone model).
    pub fn train_logits(&self, ids: &Tensor, rows: &Tensor, step_seeds: &[u64]) -> Result<Tensor> {
        self.logits_rows(ids, rows, Some(step_seeds))
    }

    /// Logits at `rows`, with dropout when `step_seeds` are given.
    ///
    /// Semantics-preserving shortcut: the last block's output projection, residual and MLP,
    /// the final norm and the LM head only run on the scored rows (4 of 64 positions in
    /// MQAR), since no later layer reads the others. The auto-encoder reads the last position
    /// of every row, so its last block runs in full.
    fn logits_rows(
        &self,
        ids: &Tensor,
        rows: &Tensor,
        step_seeds: Option<&[u64]>,
    ) -> Result<Tensor> {
        let site = |site: usize| -> Option<Vec<u64>> {
            step_seeds.map(|seeds| seeds.iter().map(|&s| site_seed(s, site)).collect())
        };
        let mut x = self.embed(ids)?;
        if let Some(seeds) = site(0) {
            x = dropout(&x, self.embed_dropout, &seeds)?;
        }
        let Some((last, earlier)) = self.blocks.split_last() else {
            return Err(crate::Error::Internal("model has no blocks".into()));
        };
        for (layer, block) in earlier.iter().enumerate() {
            let seeds = site(1 + layer);
            x = block.feed_forward(block.mix_output(&x, seeds.as_deref())?, || Ok(x.clone()))?;
        }
        let seeds = site(1 + earlier.len());
        match &self.unembedding {
            Unembedding::Lm { final_norm, head } => {
                let mixed = last.mix_rows(&x, rows, seeds.as_deref())?;
                let scored = last.feed_forward(mixed, || gather_rows(&x, rows))?; // (R, D)
                head.forward(&final_norm.forward(&scored)?)
            }
            Unembedding::AutoEncoder(autoencoder) => {
                let mixed = last.mix_output(&x, seeds.as_deref())?;
                let x = last.feed_forward(mixed, || Ok(x.clone()))?;
                autoencoder.logits_rows(&x, rows)
            }
        }
    }

    /// The positional encoding of every attention layer (`None` for convolution layers), with
    /// its current parameters: what the encoding analyses of a trained run read.
    pub fn layer_encodings(&self) -> Vec<Option<Arc<dyn Encoding>>> {
        self.blocks
            .iter()
            .map(|block| match &block.mixer {
                Mixer::Attention(mha) => Some(mha.encoding().clone()),
                _ => None,
            })
            .collect()
    }

    /// The attention weights (B, H, Tq, Tk) of every layer (`None` for convolution layers),
    /// without the LM head: analyses over thousands of rows (IoU, spectra) need only these, and
    /// skipping the (B, T, V) logits keeps their memory small. Layers after the last attention
    /// layer are not run.
    pub fn attention_weights(&self, ids: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut x = self.embed(ids)?;
        let last_attention = self
            .blocks
            .iter()
            .rposition(|b| matches!(b.mixer, Mixer::Attention(_)))
            .unwrap_or(0);
        let mut weights = Vec::with_capacity(self.blocks.len());
        for (layer, block) in self.blocks.iter().enumerate() {
            if layer > last_attention {
                weights.push(None);
                continue;
            }
            let (mixed, attention) = block.mix(&x, None)?;
            weights.push(attention.map(|a| a.weights.detach()));
            if layer < last_attention {
                x = block.feed_forward(mixed, || Ok(x.clone()))?;
            }
        }
        Ok(weights)
    }

    /// Logits at every position (B, T, V), with attention evaluated over blocks of `chunk`
    /// queries: no layer holds a T×T matrix, so sequences far longer than the training length
    /// fit. Evaluation only: the result is detached from the autograd graph.
    pub fn logits_blocks(&self, ids: &Tensor, chunk: usize) -> Result<Tensor> {
        let mut x = self.embed(ids)?.detach();
        for block in &self.blocks {
            x = block
                .feed_forward(block.mix(&x, Some(chunk))?.0, || Ok(x.clone()))?
                .detach();
        }
        Ok(self.unembedding.logits(&x)?.detach())
    }

    /// Logits at every position (B, T, V) with one head ablated ([`MultiHeadAttention::
    /// forward_ablated`]), evaluation only (detached); a layer that is not attention, or a
    /// head past its heads, is an error.
    pub fn logits_ablated(&self, ids: &Tensor, ablation: HeadAblation) -> Result<Tensor> {
        match self.blocks.get(ablation.layer).map(|b| &b.mixer) {
            Some(Mixer::Attention(mha)) if ablation.head < mha.n_heads() => {}
            _ => {
                return Err(crate::Error::argument(
                    "ablated head",
                    format!("{}.{}", ablation.layer, ablation.head),
                    "is not a head of an attention layer of this model",
                ));
            }
        }
        let mut x = self.embed(ids)?.detach();
        for (layer, block) in self.blocks.iter().enumerate() {
            let mixed = match &block.mixer {
                Mixer::Attention(mha) if layer == ablation.layer => {
                    (&x + mha.forward_ablated(&block.norm.forward(&x)?, ablation)?)?
                }
                _ => block.mix(&x, None)?.0,
            };
            x = block.feed_forward(mixed, || Ok(x.clone()))?.detach();
        }
        Ok(self.unembedding.logits(&x)?.detach())
    }

    /// Logits at every position and the attention of every attention layer.
    pub fn forward(&self, ids: &Tensor) -> Result<Forward> {
        let mut x = self.embed(ids)?;
        let mut attention = Vec::with_capacity(self.blocks.len());
        for block in &self.blocks {
            let (mixed, layer_attention) = block.mix(&x, None)?;
            x = block.feed_forward(mixed, || Ok(x.clone()))?;
            attention.push(layer_attention);
        }
        let logits = self.unembedding.logits(&x)?;
        Ok(Forward { logits, attention })
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{D, Device};

    use super::*;
    use crate::model::Ablation;
    use crate::params::Params;

    /// Zero-ablation takes exactly one head's share out of the output projection, so over all
    /// heads Σ_h (clean − ablated_h) leaves the projection's bias alone, the same at every
    /// position; mean-ablation moves each position by the head's deviation from its mean, so
    /// its changes sum to zero over the positions.
    #[test]
    fn ablating_a_head_removes_its_share_of_the_output() {
        let config = ModelConfig {
            d_model: 32,
            n_heads: 4,
            ..ModelConfig::default()
        };
        let model = Transformer::new(
            &config,
            &MechanismSpec::Softmax(Default::default()),
            &EncodingSpec::None(Default::default()),
            16,
            9,
            Precision::F32,
            &Params::new(3, &Device::Cpu),
        )
        .unwrap();
        let Some(Mixer::Attention(mha)) = model.blocks.first().map(|b| &b.mixer) else {
            panic!("the first layer is attention");
        };
        let x = crate::ops::testing::random(&[2, 9, 32], 4, "ablation");
        let clean = mha.forward(&x).unwrap().0;
        let ablated = |head, mode| {
            let ablation = HeadAblation {
                layer: 0,
                head,
                mode,
            };
            (&clean - mha.forward_ablated(&x, ablation).unwrap()).unwrap()
        };
        let mut left = clean.clone();
        for head in 0..4 {
            let change = ablated(head, Ablation::Zero);
            assert!(crate::ops::testing::max_abs(&change) > 1e-3, "head {head}");
            left = (left - change).unwrap();
            let mean_change = ablated(head, Ablation::Mean).sum((0, 1)).unwrap();
            assert!(
                crate::ops::testing::max_abs(&mean_change) < 1e-4,
                "head {head}"
            );
        }
        let first = left.narrow(1, 0, 1).unwrap().narrow(0, 0, 1).unwrap();
        let spread = left.broadcast_sub(&first).unwrap().abs().unwrap();
        let spread = spread
            .max_keepdim(D::Minus1)
            .unwrap()
            .flatten_all()
            .unwrap();
        assert!(spread.max(0).unwrap().to_scalar::<f32>().unwrap() < 1e-5);
    }
}
