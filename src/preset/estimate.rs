//! What a preset will need in memory, known before anything is allocated: the parameters, the
//! optimiser's state and gradients, a training step's activations (attention matrices
//! included), the attention kept for the views, and the data. `attnlab check`, `attnlab train`,
//! sweeps and the window's Start button all read it, and a run that cannot fit is refused with
//! the estimate and the setting to change, instead of aborting on an allocation minutes in.
//!
//! Sizes are counted in f64, so absurd settings (a vocabulary of 2^62) give an absurd estimate
//! rather than an overflow. The counts follow the model's construction (`model::Transformer`):
//! the parameter count is exact for the large terms and checked against built models in the
//! tests; activations are an estimate of what a step keeps alive at once, calibrated against
//! the peak resident memory of real runs (`tests/memory.rs`).

use super::Preset;
use crate::attention::{LayerSize, MechanismSpec};
use crate::model::{AutoEncoder, Head, Layout, MixerKind, Mlp, Norm};
use crate::tasks::TaskSpec;
use crate::{Error, Result};

/// A process's own memory before any of the run's: the binary, the allocator, thread stacks.
const BASELINE_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// Activations' share that the threads' allocators may hold on top of a step's own: memory
/// one thread frees goes back to the thread that allocated it, so when a busy machine moves
/// work between threads a step can't reuse all of it. Measured (`attnlab train`, ReBased,
/// batch 256, 3 steps, 2 threads): peaks of 240 MB alone, 240–280 MB beside two busy
/// processes: 40 MB, a quarter of the 160 MB its activations are estimated at.
const ALLOCATOR_SLACK: f64 = 0.25;
/// Bytes of an f32.
const F32: f64 = 4.0;

/// The memory a run of a preset needs, in bytes, by what holds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// Parameters, counted (not bytes).
    pub parameters: f64,
    /// The parameters' values.
    pub weights: f64,
    /// Gradients and AdamW's two moments.
    pub optimiser: f64,
    /// What a training step keeps alive in its layers (activations and attention matrices),
    /// with [`ALLOCATOR_SLACK`] on top.
    pub activations: f64,
    /// A training step's logits, their softmax and gradient (batch × length × vocabulary).
    pub logits: f64,
    /// The attention matrices saved at each evaluation for the views.
    pub kept_attention: f64,
    /// The training and test data.
    pub data: f64,
}

/// Which part of the estimate, for naming the setting to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Weights,
    Activations,
    Logits,
    KeptAttention,
    Data,
}

impl MemoryEstimate {
    /// A group of `replicas` models of one shape trained as one (a sweep's replicas): every
    /// per-model part times `replicas`, the data once.
    pub fn replicated(self, replicas: usize) -> Self {
        let r = replicas as f64;
        Self {
            parameters: self.parameters * r,
            weights: self.weights * r,
            optimiser: self.optimiser * r,
            activations: self.activations * r,
            logits: self.logits * r,
            kept_attention: self.kept_attention * r,
            data: self.data,
        }
    }

    /// Every part, and the process's own baseline.
    pub fn total(&self) -> f64 {
        self.weights
            + self.optimiser
            + self.activations
            + self.logits
            + self.kept_attention
            + self.data
            + BASELINE_BYTES
    }

    fn largest(&self) -> Part {
        let parts = [
            (Part::Weights, self.weights + self.optimiser),
            (Part::Activations, self.activations),
            (Part::Logits, self.logits),
            (Part::KeptAttention, self.kept_attention),
            (Part::Data, self.data),
        ];
        parts
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(Part::Weights, |(part, _)| part)
    }

    /// The settings that drive the largest part, to name in a refusal.
    fn what_to_lower(&self) -> &'static str {
        match self.largest() {
            Part::Weights => "model.d_model, model.n_layers or task.vocab_size",
            Part::Activations => "train.batch_size, task.seq_len or model.d_model",
            Part::Logits => "task.vocab_size or train.batch_size",
            Part::KeptAttention => "eval.attention_examples or task.seq_len",
            Part::Data => "task.train_examples, task.test_examples or task.seq_len",
        }
    }
}

impl std::fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "≈ {} ({} parameters: weights {}, gradients and optimiser {}, activations {}, \
             logits {}, kept attention {}, data {}, the process itself {})",
            bytes(self.total()),
            grouped(self.parameters),
            bytes(self.weights),
            bytes(self.optimiser),
            bytes(self.activations),
            bytes(self.logits),
            bytes(self.kept_attention),
            bytes(self.data),
            bytes(BASELINE_BYTES)
        )
    }
}

/// A count with its thousands grouped: 46,210 rather than 4.621e4.
fn grouped(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `n` bytes in the largest unit that keeps a number ≥ 1.
pub fn bytes(n: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{value:.0} {}", UNITS[unit]),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

impl Preset {
    /// What a run of this preset needs in memory.
    pub fn memory_estimate(&self) -> MemoryEstimate {
        let parameters = parameter_count(self);
        let weights = parameters * F32;
        MemoryEstimate {
            parameters,
            weights,
            optimiser: 3.0 * weights,
            activations: (1.0 + ALLOCATOR_SLACK) * activation_bytes(self),
            logits: logit_bytes(self),
            kept_attention: kept_attention_bytes(self),
            data: data_bytes(&self.task),
        }
    }

    /// [`Preset::check_fits`] against this machine's free memory when the run is on the CPU
    /// (a GPU run's activations live on the GPU, which this estimate does not query).
    pub fn check_fits_here(&self) -> Result<MemoryEstimate> {
        self.check_group_fits_here(1)
    }

    /// [`Preset::check_fits_here`] for a sweep's group of `replicas` models of this preset.
    pub fn check_group_fits_here(&self, replicas: usize) -> Result<MemoryEstimate> {
        let estimate = self.memory_estimate().replicated(replicas);
        match self.train.device {
            crate::device::DeviceName::Cpu => {
                fits(estimate, crate::memory::available_bytes().map(|b| b as f64))
            }
            _ => Ok(estimate),
        }
    }

    /// The estimate, or an error that gives it and the settings to lower when it exceeds
    /// `available` bytes (the machine's free memory; `None` where that is unknown).
    pub fn check_fits(&self, available: Option<f64>) -> Result<MemoryEstimate> {
        fits(self.memory_estimate(), available)
    }

    /// A group of `replicas` models on a GPU with `free` bytes free on `device`: an error when
    /// their weights, gradients and AdamW moments alone exceed it, before any is made. Only that
    /// part, which is exact: the activations are estimated from the CPU's kernels and may
    /// overcount a GPU's, so a run that might fit is not refused on a guess. Without it a run far
    /// too large for the card spent minutes drawing weights on the host before CUDA said out of
    /// memory.
    pub fn check_state_fits_on_gpu(
        &self,
        replicas: usize,
        device: crate::device::DeviceName,
        free: f64,
    ) -> Result<MemoryEstimate> {
        let estimate = self.memory_estimate().replicated(replicas);
        let state = estimate.weights + estimate.optimiser;
        if state <= free {
            return Ok(estimate);
        }
        Err(Error::TooLarge {
            needs: format!(
                "{} for its weights, gradients and AdamW moments alone",
                bytes(state)
            ),
            available: format!("{} free on {device}", bytes(free)),
            lower: match replicas {
                1 => "model.d_model, model.n_layers or task.vocab_size",
                _ => "model.d_model, model.n_layers, task.vocab_size or the sweep's replicas",
            },
        })
    }
}

/// `estimate`, or the error that says it exceeds `available`.
fn fits(estimate: MemoryEstimate, available: Option<f64>) -> Result<MemoryEstimate> {
    match available {
        Some(available) if estimate.total() > available => Err(Error::TooLarge {
            needs: estimate.to_string(),
            available: format!("{} of memory available here", bytes(available)),
            lower: estimate.what_to_lower(),
        }),
        _ => Ok(estimate),
    }
}

/// Layers whose mixer is attention.
fn attention_layers(preset: &Preset) -> f64 {
    (0..preset.model.n_layers)
        .filter(|&l| preset.model.mixer(l) == MixerKind::Attention)
        .count() as f64
}

/// The sizes [`crate::attention::Variant::memory`] reads.
fn layer_size(preset: &Preset) -> LayerSize {
    let m = &preset.model;
    LayerSize {
        d_model: m.d_model as f64,
        heads: m.n_heads as f64,
        qk: preset.attention.qk_dim(m.head_dim()) as f64,
        head_dim: m.head_dim() as f64,
        len: preset.task.seq_len() as f64,
    }
}

/// A linear layer's weights and bias.
fn linear(inputs: f64, outputs: f64) -> f64 {
    inputs * outputs + outputs
}

/// The parameters `model::Transformer::new` creates for `preset`.
fn parameter_count(preset: &Preset) -> f64 {
    let m = &preset.model;
    let (d, vocab) = (m.d_model as f64, preset.task.vocab_size() as f64);
    let (heads, head_dim) = (m.n_heads as f64, m.head_dim() as f64);
    let qk = preset.attention.qk_dim(m.head_dim()) as f64;
    let attention = linear(d, heads * (2.0 * qk + head_dim))
        + linear(heads * head_dim, d)
        + preset.attention.memory(&layer_size(preset)).parameters;
    let mut blocks = 0.0;
    for layer in 0..m.n_layers {
        let norm = Norm::parameters(m.d_model, m.layout) as f64;
        blocks += norm; // the block's norm
        blocks += match m.mixer(layer) {
            MixerKind::Attention => attention,
            MixerKind::ShortConv => m.conv_kernel as f64 * d + d + linear(d, d),
            MixerKind::PrevToken => 0.0,
        };
        blocks += match (m.mlp_ratio, m.layout) {
            (0, Layout::Attnlab | Layout::Mad) => 0.0,
            (0, Layout::Zoology) => norm,
            _ => norm + Mlp::parameters((m.d_model, m.mlp_hidden()), m.layout) as f64,
        };
    }
    let final_norm = Norm::parameters(m.d_model, m.layout) as f64;
    let head = match (preset.head(), m.layout) {
        (Head::Autoencoder, _) => AutoEncoder::parameters(m.d_model, vocab as usize) as f64,
        (_, Layout::Zoology) => final_norm,
        (_, Layout::Attnlab | Layout::Mad) if m.tie_embeddings => final_norm + vocab,
        (_, Layout::Attnlab | Layout::Mad) => final_norm + linear(d, vocab),
    };
    let encodings = preset.encoding.parameters(&preset.encoding_shape()) as f64
        * if preset.encoding.is_per_layer() {
            attention_layers(preset)
        } else {
            1.0
        };
    vocab * d + blocks + head + encodings
}

/// What one training step keeps alive at its peak in its layers: per layer the normalised
/// input, queries, keys and values, the attention scores and weights with their gradient, the
/// mixer's output and the MLP's hidden activations, twice over (values and gradients during
/// the backward pass).
fn activation_bytes(preset: &Preset) -> f64 {
    let m = &preset.model;
    let (batch, len) = (preset.train.batch_size as f64, preset.task.seq_len() as f64);
    let tokens = batch * len;
    let (d, heads) = (m.d_model as f64, m.n_heads as f64);
    let qk = preset.attention.qk_dim(m.head_dim()) as f64;
    let terms = preset.attention.memory(&layer_size(preset));
    let per_layer = tokens * (6.0 * d + 2.0 * heads * qk + 2.0 * (m.mlp_ratio as f64) * d);
    let norms = tokens * terms.norms;
    let attention = norms
        + match trains_without_weights(preset) {
            true => 0.0,
            false => 3.0 * batch * heads * len * terms.keys + 2.0 * tokens * heads * terms.features,
        };
    let layers = m.n_layers as f64;
    // The auto-encoder's decoder at every scored position: z, three norms, two layers and
    // their GELUs.
    let decoder = match preset.head() {
        Head::Autoencoder => tokens * 9.0 * d,
        Head::Auto | Head::Lm => 0.0,
    };
    F32 * 2.0 * (layers * per_layer + attention_layers(preset) * attention + decoder)
        + attention_layers(preset) * saved_for_backward(preset)
}

/// What the fused attention of one layer keeps from its forward pass for its backward pass:
/// two f32 per row of every head, and with attention dropout its mask, a byte per weight.
fn saved_for_backward(preset: &Preset) -> f64 {
    if !trains_without_weights(preset) {
        return 0.0;
    }
    let (batch, len) = (preset.train.batch_size as f64, preset.task.seq_len() as f64);
    // Only softmax attention has dropout (as in zoology); the kernel mechanisms keep no mask.
    let dropout = matches!(preset.attention, MechanismSpec::Softmax(_))
        && preset.model.attention_dropout() > 0.0;
    let mask = match dropout {
        true => len,
        false => 0.0,
    };
    batch * preset.model.n_heads as f64 * len * (2.0 * F32 + mask)
}

/// Whether a training step computes attention without its (B, H, T, T) scores and weights and
/// without kernel feature maps ([`crate::ops::cpu_attention`]): on the CPU in f32, for a mechanism that trains fused (not Linformer), with
/// an encoding that adds no bias and positions q and k alone (not ReRoPE's two score matrices),
/// as the mechanisms' `fused_output` decides. A GPU run is estimated with them, flash attention
/// or not.
fn trains_without_weights(preset: &Preset) -> bool {
    preset.train.device == crate::device::DeviceName::Cpu
        && preset.train.precision != crate::ops::Precision::Bf16
        && preset.attention.trains_fused()
        && preset.encoding.positions_q_and_k_alone()
}

/// A step's logits, their softmax and their gradient, at the scored positions only (MQAR
/// scores its queries, a language model every position), and a fourth copy: the allocator
/// may still hold the previous step's or an evaluation's when the next is made (a run's
/// peak varied by that much from run to run once attention's weights no longer hid it).
fn logit_bytes(preset: &Preset) -> f64 {
    let scored = preset.task.scored_per_row();
    F32 * 4.0 * (preset.train.batch_size * scored) as f64 * preset.task.vocab_size() as f64
}

/// The attention matrices an evaluation saves for the views.
fn kept_attention_bytes(preset: &Preset) -> f64 {
    let len = preset.task.seq_len() as f64;
    let examples = preset.eval.attention_examples as f64;
    F32 * examples * preset.model.n_heads as f64 * len * len * attention_layers(preset)
}

/// The datasets in memory: token ids and labels per position, and what the task keeps
/// beside them ([`TaskSpec::extra_data_bytes`]: MQAR's ground truth per query, a language
/// model's text).
fn data_bytes(task: &TaskSpec) -> f64 {
    let rows = task.train_examples() as f64 + task.test_examples() as f64;
    rows * task.seq_len() as f64 * 8.0 + task.extra_data_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::MechanismSpec;
    use crate::encodings::EncodingSpec;
    use crate::params::Params;

    /// The parts in words add up to the total (the process's own baseline was left out),
    /// and the parameters are a grouped count, not 4.621e4.
    #[test]
    fn the_estimate_in_words_adds_up() {
        assert_eq!(grouped(46_210.0), "46,210");
        assert_eq!(grouped(579_260.0), "579,260");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1_000_000.0), "1,000,000");
        // Whole tenths of a MB, so that the rounded parts add up exactly.
        const MB: f64 = 1024.0 * 1024.0;
        let estimate = MemoryEstimate {
            parameters: 46_210.0,
            weights: 1.0 * MB,
            optimiser: 3.0 * MB,
            activations: 40.0 * MB,
            logits: 2.0 * MB,
            kept_attention: 1.5 * MB,
            data: 20.0 * MB,
        };
        let text = estimate.to_string();
        assert!(text.contains("(46,210 parameters: "), "{text}");
        assert!(text.ends_with("the process itself 64.0 MB)"), "{text}");
        // "≈ TOTAL (N parameters: weights W, …, the process itself B)"
        let megabytes = |shown: &str| -> f64 {
            let number = shown
                .strip_suffix(" MB")
                .unwrap_or_else(|| panic!("{shown}"));
            number.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let (total, parts) = text.trim_start_matches("≈ ").split_once(" (").unwrap();
        let (_, parts) = parts
            .trim_end_matches(')')
            .split_once("parameters: ")
            .unwrap();
        let parts: Vec<f64> = parts.split(", ").map(megabytes).collect();
        assert_eq!(parts.len(), 7, "{text}");
        assert_eq!(parts.iter().sum::<f64>(), megabytes(total), "{text}");
    }

    /// Shipped preset `name` with `overrides`, and the parameters of its model, built.
    fn shipped_model(name: &str, overrides: &[String]) -> (Preset, Params) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("presets")
            .join(format!("{name}.toml"));
        let preset = Preset::load(&path, overrides).unwrap();
        let params = Params::new(0, &candle_core::Device::Cpu);
        preset.build_model(&params).unwrap();
        (preset, params)
    }

    fn tiny() -> Preset {
        let mut preset = Preset::default();
        preset.model.d_model = 32;
        preset.model.n_heads = 4;
        preset.model.n_layers = 2;
        let TaskSpec::Mqar(t) = &mut preset.task else {
            unreachable!("the default task is MQAR")
        };
        t.seq_len = 32;
        t.vocab_size = 64;
        t.num_kv_pairs = 4;
        preset
    }

    /// Every mechanism × encoding × layout × MLP choice: the count equals the parameters a
    /// built model holds (the small per-head tables of ALiBi-like encodings aside).
    #[test]
    fn the_parameter_count_is_that_of_the_built_model() {
        for mechanism in MechanismSpec::all_defaults() {
            for encoding in EncodingSpec::all_defaults() {
                for (layout, mlp_ratio, tie, head) in [
                    (Layout::Attnlab, 0, false, Head::Auto),
                    (Layout::Attnlab, 4, true, Head::Lm),
                    (Layout::Zoology, 2, false, Head::Auto),
                    (Layout::Mad, 4, false, Head::Auto),
                    (Layout::Mad, 0, true, Head::Auto),
                    (Layout::Mad, 4, false, Head::Autoencoder),
                    (Layout::Zoology, 0, false, Head::Autoencoder),
                ] {
                    let mut preset = tiny();
                    preset.attention = mechanism.clone();
                    preset.encoding = encoding.clone();
                    preset.model.layout = layout;
                    preset.model.mlp_ratio = mlp_ratio;
                    preset.model.tie_embeddings = tie;
                    preset.model.head = head;
                    if preset.validate().is_err() {
                        continue;
                    }
                    let params = Params::new(0, &candle_core::Device::Cpu);
                    preset.build_model(&params).unwrap();
                    let built = params.count() as f64;
                    let counted = parameter_count(&preset);
                    assert!(
                        (built - counted).abs() <= 16.0,
                        "{} + {} {layout:?} mlp {mlp_ratio} {head:?}: built {built}, counted {counted}",
                        mechanism.name(),
                        encoding.name()
                    );
                }
            }
        }
    }

    #[test]
    fn absurd_sizes_give_an_estimate_and_a_refusal_naming_what_to_lower() {
        let mut preset = tiny();
        let TaskSpec::Mqar(t) = &mut preset.task else {
            unreachable!()
        };
        t.vocab_size = 1 << 40;
        let eight_gb = Some(8.0 * 1024f64.powi(3));
        let err = preset.check_fits(eight_gb).unwrap_err().to_string();
        assert!(err.contains("lower task.vocab_size"), "{err}");
        assert!(err.contains("8.0 GB of memory available"), "{err}");
        let mut preset = tiny();
        preset.eval.attention_examples = 1 << 24;
        let err = preset.check_fits(eight_gb).unwrap_err().to_string();
        assert!(err.contains("lower eval.attention_examples"), "{err}");
        let mut preset = tiny();
        preset.model.d_model = 1 << 16;
        let err = preset.check_fits(eight_gb).unwrap_err().to_string();
        assert!(err.contains("lower model.d_model"), "{err}");
        assert!(tiny().check_fits(eight_gb).is_ok());
        assert!(tiny().check_fits(None).is_ok());
    }

    /// On a GPU only the weights, gradients and moments are held against its free memory:
    /// d_model 8192 × 64 layers (hundreds of GB of them) is refused on a 141 GB card before any
    /// weight is drawn, naming the settings that shrink them even where activations are the
    /// larger part; a model whose activations alone exceed the card is left to start.
    #[test]
    fn a_gpu_refuses_weights_that_cannot_fit_and_names_the_device() {
        let gpu = crate::device::DeviceName::Cuda(0);
        let card = 141.0e9;
        let mut huge = tiny();
        (huge.model.d_model, huge.model.n_layers) = (8192, 64);
        let err = huge
            .check_state_fits_on_gpu(1, gpu, card)
            .unwrap_err()
            .to_string();
        assert!(err.contains("free on cuda:0"), "{err}");
        assert!(err.contains("AdamW moments alone"), "{err}");
        assert!(err.contains("lower model.d_model"), "{err}");
        huge.train.batch_size = 1 << 14;
        assert_eq!(huge.memory_estimate().largest(), Part::Activations);
        let refusal = |h: &Preset, replicas| {
            let err = h.check_state_fits_on_gpu(replicas, gpu, card).unwrap_err();
            err.to_string()
        };
        assert!(refusal(&huge, 1).contains("lower model.d_model"));
        assert!(refusal(&huge, 6).contains("or the sweep's replicas"));
        let mut long = tiny();
        let TaskSpec::Mqar(t) = &mut long.task else {
            unreachable!()
        };
        t.seq_len = 1 << 20;
        assert!(long.memory_estimate().activations > card);
        assert!(long.check_state_fits_on_gpu(1, gpu, card).is_ok());
        let one = tiny().memory_estimate();
        let state = one.weights + one.optimiser;
        assert!(tiny().check_state_fits_on_gpu(6, gpu, 6.5 * state).is_ok());
        assert!(tiny().check_state_fits_on_gpu(6, gpu, 5.5 * state).is_err());
    }

    #[test]
    fn a_group_of_replicas_needs_each_model_once_and_the_data_once() {
        let one = tiny().memory_estimate();
        let six = one.replicated(6);
        assert_eq!(six.weights, 6.0 * one.weights);
        assert_eq!(six.activations, 6.0 * one.activations);
        assert_eq!(six.data, one.data);
    }

    #[test]
    fn sizes_read_in_their_unit() {
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(1536.0), "1.5 KB");
        assert_eq!(bytes(25.6e9), "23.8 GB");
    }

    /// MAD's benchmark model (d 128, 16 heads, attention + SwiGLU twice, vocabulary 16), counted
    /// by hand from mad-lab's modules: embedding 16·128; per block an RMSNorm (128), the qkv and
    /// output projections with biases (128·384 + 384, 128·128 + 128), an RMSNorm and SwiGLU
    /// 3·128·352; the final RMSNorm and the head with a bias (128·16 + 16). Its biases start at
    /// zero and its norms have no shift.
    #[test]
    fn the_mad_layout_builds_mads_model() {
        assert_eq!(crate::model::Layout::Mad.mlp_hidden(128, 4), 352);
        assert_eq!(crate::model::Layout::Attnlab.mlp_hidden(128, 4), 512);
        let (_, params) = shipped_model("mad_in_context_recall", &[]);
        let block = 128 + (128 * 384 + 384) + (128 * 128 + 128) + 128 + 3 * 128 * 352;
        assert_eq!(params.count(), 16 * 128 + 2 * block + 128 + (128 * 16 + 16));
        for (name, var) in params.vars() {
            let values = var.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(!name.ends_with("norm.bias"), "{name}: RMSNorm has no bias");
            if name.ends_with("bias") {
                assert!(values.iter().all(|&v| v == 0.0), "{name} starts at zero");
            }
            if name.starts_with("embedding") {
                let std = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
                assert!((std - 0.02).abs() < 0.002, "{name}: std {std}");
            }
        }
    }

    /// The ReBased paper's MQAR model, whose 12 heads do not divide d_model 64: each head has
    /// 64 // 12 = 5 value channels, 60 in all, and the output projection maps them back to 64.
    /// Its count is the hand count from the paper's code (rebased-mqar-iou.md §2.4: 8192·d +
    /// L·d + 10d + d² + 5d + 2·d·192 + 2·d·60 + 768 = 578,752 at d 64, L 256) plus the
    /// attention projections' biases (192 + 192 + 60 + 64), which zoology's layout gives every
    /// mechanism (zero at the start) and the paper's Based and ReBased do not have.
    #[test]
    fn heads_that_do_not_divide_the_width_get_its_floor() {
        let (preset, params) = shipped_model("mqar_rebased_paper", &[]);
        let dims: std::collections::HashMap<String, Vec<usize>> = params
            .vars()
            .into_iter()
            .map(|(name, var)| (name, var.dims().to_vec()))
            .collect();
        assert_eq!(dims["blocks.1.attn.qkv.weight"], [192 + 192 + 60, 64]);
        assert_eq!(dims["blocks.1.attn.out.weight"], [64, 60]);
        assert_eq!(params.count(), 578_752 + 192 + 192 + 60 + 64);
        assert_eq!(params.count() as f64, parameter_count(&preset));
    }

    /// MAD's compression model, counted by hand from mad-lab's `AutoEncoder`: the blocks of
    /// its language model without the final norm, then the decoder (RMSNorm, Linear(d, d),
    /// twice) and the unembedding (RMSNorm, Linear(d, V)), all with biases; `_init_weights`
    /// starts every linear weight N(0, 0.02), the blocks' included, and every bias at zero.
    #[test]
    fn compression_builds_mads_auto_encoder() {
        let overrides = ["task.probe=compression".into()];
        let (preset, params) = shipped_model("mad_in_context_recall", &overrides);
        assert_eq!(preset.head(), Head::Autoencoder);
        let block = 128 + (128 * 384 + 384) + (128 * 128 + 128) + 128 + 3 * 128 * 352;
        let decoder = 3 * 128 + 2 * (128 * 128 + 128) + (128 * 16 + 16);
        assert_eq!(params.count(), 16 * 128 + 2 * block + decoder);
        assert_eq!(params.count() as f64, parameter_count(&preset));
        for (name, var) in params.vars() {
            let values = var.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let std = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
            match name.rsplit('.').next() {
                Some("bias") => assert_eq!(std, 0.0, "{name} starts at zero"),
                Some("weight") if !name.contains("norm") && values.len() > 1000 => {
                    assert!((std - 0.02).abs() < 0.002, "{name}: std {std}");
                }
                _ => {}
            }
        }
    }
}
