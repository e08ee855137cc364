//! `attnlab heads` and `attnlab attend`: a pretrained model from a Hugging Face folder, its
//! heads scored on the induction probe ([`crate::analysis::heads`]), or its attention on a
//! text.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Args;

use crate::analysis::ablation::ablation_grid;
use crate::analysis::heads::InductionProbe;
use crate::analysis::reading::{induction_scores, read_text, tokenise};
use crate::checkpoint;
use crate::model::Ablation;
use crate::report::attend::AttendReport;
use crate::report::heads::HeadsReport;
use crate::report::{Format, render, save_figures};

#[derive(Debug, Args)]
pub struct HeadsArgs {
    /// A Hugging Face model folder (config.json, model.safetensors or pytorch_model.bin), e.g. a
    /// download of gpt2.
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
    /// to NAME-induction-iou.EXT, NAME-induction-soft-iou.EXT, NAME-previous-token.EXT,
    /// NAME-first-token.EXT and NAME-entropy.EXT.
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
    let scores = induction_scores(&pretrained, &probe)?;
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

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("input").required(true))]
pub struct AttendArgs {
    /// A Hugging Face model folder with its tokenizer.json (config.json, model.safetensors or
    /// pytorch_model.bin).
    model: PathBuf,
    /// The text to read.
    #[arg(long, group = "input")]
    text: Option<String>,
    /// A UTF-8 file holding the text to read.
    #[arg(long, group = "input")]
    text_file: Option<PathBuf>,
    /// Read the text as it is, without the model's beginning-of-sequence token before it
    /// (TransformerLens prepends it; attention sinks on it).
    #[arg(long)]
    no_first: bool,
    /// The layer of the head the figure draws.
    #[arg(long, default_value_t = 0)]
    layer: usize,
    /// The head the figure draws.
    #[arg(long, default_value_t = 0)]
    head: usize,
    /// Ablate each head in turn (its output zeroed, or set to its mean over the text) and
    /// report the next-token loss change (a forward pass per head).
    #[arg(long, value_enum)]
    ablate: Option<Ablation>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Write the chosen head's map (.svg, .png, or .csv with every head's weights and tokens).
    #[arg(long)]
    figure: Option<PathBuf>,
}

/// `attnlab attend`.
pub fn attend(args: &AttendArgs) -> anyhow::Result<()> {
    let device = candle_core::Device::Cpu;
    // clap requires one of the two.
    let text = match &args.text_file {
        Some(path) => crate::io::read_text(path, "the text file", crate::io::MAX_TEXT_FILE)?,
        None => args.text.clone().unwrap_or_default(),
    };
    let pretrained = checkpoint::open(&args.model, &device)?;
    let tokenizer = checkpoint::TextTokenizer::open(&args.model)?;
    let tokens = tokenise(&pretrained, &tokenizer, &text, !args.no_first)?;
    let (layers, heads) = (
        pretrained.model_config.n_layers,
        pretrained.model_config.n_heads,
    );
    anyhow::ensure!(
        args.layer < layers && args.head < heads,
        "--layer {} --head {}: the model has {layers} layers of {heads} heads",
        args.layer,
        args.head
    );
    let reading = read_text(&pretrained, tokens)?;
    let ablation = match args.ablate {
        Some(mode) => {
            anyhow::ensure!(
                reading.tokens.ids.len() >= 2,
                "an ablation needs two tokens or more to predict one"
            );
            let ids = reading.ids(&device)?;
            let shape = (reading.layers.as_slice(), heads);
            let never = AtomicBool::new(false);
            ablation_grid(&pretrained.model, &ids, shape, mode, &mut |_| {}, &never)?
        }
        None => None,
    };
    let report = AttendReport {
        model: args.model.clone(),
        family: pretrained.family,
        tokens: reading.tokens,
        scores: reading.scores,
        attention: reading.attention,
        shown: (args.layer, args.head),
        ablation,
    };
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    Ok(())
}
