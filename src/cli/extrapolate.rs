//! `attnlab extrapolate`: validation perplexity against evaluation length for trained LM runs
//! (presets are trained first), with Definition 0.1's check beside Theorem 0.4's verdict.

use std::io::Write as _;
use std::path::PathBuf;

use clap::Args;

use crate::extrapolation::{self, Options, Protocol};
use crate::report::extrapolation::ExtrapolationReport;
use crate::report::{Format, render, save_figures};
use crate::train::RunDir;

#[derive(Debug, Args)]
pub struct ExtrapolateArgs {
    /// Presets (files ending in .toml: trained first) or run folders of LM runs; or one
    /// pretrained model's Hugging Face folder (GPT-2, Pythia, GPT-Neo) with --corpus.
    #[arg(required = true)]
    targets: Vec<PathBuf>,
    /// A pretrained model's text to score (UTF-8, read through the folder's tokenizer.json).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Evaluation lengths in tokens, comma-separated (default L,2L,4L,…,64L; for a
    /// pretrained model L/4,L/2,L,2L,4L with L its positions).
    #[arg(long, value_delimiter = ',')]
    lengths: Vec<usize>,
    #[arg(long, value_enum, default_value_t = Protocol::NonOverlapping)]
    protocol: Protocol,
    /// Sliding protocol: tokens scored per window (default n/2).
    #[arg(long)]
    stride: Option<usize>,
    /// Queries per attention block (memory: chunk × n weights per head and layer).
    #[arg(long, default_value_t = 256)]
    chunk: usize,
    /// Validation tokens scored at most.
    #[arg(long, default_value_t = 65_536)]
    max_tokens: usize,
    /// Definition 0.1's δ.
    #[arg(long, default_value_t = 0.1)]
    delta: f64,
    /// Do not add PI, NTK, ReRoPE and Leaky ReRoPE curves for RoPE runs.
    #[arg(long)]
    no_variants: bool,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Save the perplexity-vs-length figure (.svg, .png or .csv).
    #[arg(long)]
    figure: Option<PathBuf>,
    /// Perplexity on a log axis in the figure.
    #[arg(long)]
    log_ppl: bool,
    /// Also write the combined JSON here (each run folder always gets its own).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override a key of every preset target, e.g. --set train.max_steps=100 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Folder under which preset targets are trained.
    #[arg(long, default_value = "runs")]
    runs: PathBuf,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

pub fn extrapolate(args: &ExtrapolateArgs) -> anyhow::Result<()> {
    // Ctrl-C or SIGTERM: a run in training stops (and is kept), nothing more starts.
    let cancel = super::signals::install();
    let quiet = args.quiet;
    let mut last = -1i32;
    let mut progress = |label: &str, f: f32| {
        let percent = (100.0 * f) as i32;
        if !quiet && percent != last {
            last = percent;
            let _ = write!(std::io::stderr(), "\r{label} {percent:3}%");
            if percent == 100 {
                let _ = writeln!(std::io::stderr());
            }
        }
    };
    let options = Options {
        lengths: args.lengths.clone(),
        protocol: args.protocol,
        stride: args.stride,
        chunk: args.chunk,
        max_tokens: args.max_tokens,
        delta: args.delta,
        rotary_variants: !args.no_variants,
        ..Options::default()
    };
    // Before training any preset target: a bad option would only show after it.
    options.validate()?;
    let sweep = match pretrained_target(args)? {
        Some(folder) => {
            let Some(corpus) = &args.corpus else {
                anyhow::bail!(
                    "{} is a pretrained model's folder: give the text to score with --corpus FILE",
                    folder.display()
                );
            };
            extrapolation::pretrained::extrapolate_folder(
                folder,
                corpus,
                &options,
                &mut |f| progress("evaluating", f),
                cancel,
            )?
        }
        None => {
            anyhow::ensure!(
                args.corpus.is_none(),
                "--corpus is for a pretrained model's folder: runs are scored on their own \
                 validation text"
            );
            runs_sweep(args, &options, &mut progress, cancel)?
        }
    };
    if let Some(path) = &args.out {
        crate::io::write_json(path, &sweep)?;
    }
    let left_out = sweep.left_out.clone();
    for run in &left_out {
        eprintln!("left out: {run}");
    }
    let report = ExtrapolationReport {
        sweep,
        log_ppl: args.log_ppl,
    };
    if let Some(path) = &args.figure {
        save_figures(&report, path)?;
    }
    out!("{}", render(&report, args.format)?);
    // The table is printed (and saved) either way; the exit status says it is not whole.
    anyhow::ensure!(
        left_out.is_empty(),
        "{} of the runs left out (above): the table holds the others",
        left_out.len()
    );
    Ok(())
}

/// The one target when it is a pretrained model's folder (a `config.json` and no
/// `preset.toml`); several targets with a model folder among them are refused.
fn pretrained_target(args: &ExtrapolateArgs) -> anyhow::Result<Option<&PathBuf>> {
    let is_model = |t: &PathBuf| t.join("config.json").is_file() && !t.join("preset.toml").exists();
    match args.targets.iter().find(|t| is_model(t)) {
        Some(folder) if args.targets.len() > 1 => anyhow::bail!(
            "{} is a pretrained model's folder: extrapolate it alone, not beside other targets",
            folder.display()
        ),
        found => Ok(found),
    }
}

/// Trains the preset targets, then evaluates every run.
fn runs_sweep(
    args: &ExtrapolateArgs,
    options: &Options,
    progress: &mut dyn FnMut(&str, f32),
    cancel: &std::sync::atomic::AtomicBool,
) -> anyhow::Result<extrapolation::Extrapolation> {
    let (presets, mut runs) = split_targets(args)?;
    if !presets.is_empty() {
        let trained = extrapolation::train_presets(
            &presets,
            &args.runs,
            &mut |f| progress("training", f),
            &mut |_, _| {},
            cancel,
        )?;
        runs.splice(0..0, trained);
    }
    Ok(extrapolation::extrapolate_runs(
        &runs,
        options,
        &mut |f| progress("evaluating", f),
        cancel,
    )?)
}

/// Preset files or shipped presets' names (loaded with the overrides) and run folders, in the
/// order given.
fn split_targets(args: &ExtrapolateArgs) -> anyhow::Result<(Vec<crate::Preset>, Vec<RunDir>)> {
    let mut presets = Vec::new();
    let mut runs = Vec::new();
    for target in &args.targets {
        let preset = target.extension().is_some_and(|e| e == "toml");
        if preset || crate::experiments::is_shipped_preset(target) {
            presets.push(crate::experiments::load_preset(target, &args.overrides)?);
        } else {
            runs.push(RunDir::open(target)?);
        }
    }
    Ok((presets, runs))
}
