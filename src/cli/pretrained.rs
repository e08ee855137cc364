//! `attnlab heads`: a pretrained model from a Hugging Face folder, its heads scored on the
//! induction probe ([`crate::analysis::heads`]).

use std::path::PathBuf;

use candle_core::Tensor;
use clap::Args;

use crate::analysis::heads::{InductionProbe, head_scores};
use crate::checkpoint;
use crate::report::heads::HeadsReport;
use crate::report::{Format, render, save_figures};

#[derive(Debug, Args)]
pub struct HeadsArgs {
    /// A Hugging Face model folder (config.json, model.safetensors), e.g. a download of gpt2.
    model: PathBuf,
    /// Random tokens in each half of a probe sequence (TransformerLens's examples use 50).
    #[arg(long, default_value_t = 50, value_parser = super::bounded(2, 4096))]
    half: usize,
    /// Probe sequences to average over.
    #[arg(long, default_value_t = 8, value_parser = super::bounded(1, 1024))]
    rows: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the layers × heads induction heatmap (.svg, .png or .csv); the other scores go
    /// to NAME-previous-token.EXT, NAME-first-token.EXT and NAME-entropy.EXT.
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab heads`.
pub fn heads(args: &HeadsArgs) -> anyhow::Result<()> {
    let device = candle_core::Device::Cpu;
    let pretrained = checkpoint::open(&args.model, &device)?;
    let probe = InductionProbe {
        rows: args.rows,
        half: args.half,
        vocab: pretrained.vocab_size,
        first: pretrained.first_token,
        seed: args.seed,
    };
    anyhow::ensure!(
        probe.len() <= pretrained.max_len,
        "a probe of {} tokens is longer than the model's {} positions: lower --half",
        probe.len(),
        pretrained.max_len
    );
    let ids = Tensor::from_vec(probe.tokens(), (probe.rows, probe.len()), &device)?;
    let weights = pretrained.model.attention_weights(&ids)?;
    let mut scores = Vec::new();
    for (layer, weights) in weights.iter().enumerate() {
        if let Some(weights) = weights {
            scores.extend(head_scores(weights, layer, &probe)?);
        }
    }
    let report = HeadsReport {
        model: args.model.clone(),
        family: pretrained.family,
        probe_text: probe.describe(),
        probe,
        layers: pretrained.model_config.n_layers,
        heads: pretrained.model_config.n_heads,
        scores,
    };
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}
