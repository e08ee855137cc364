//! The headless command line: the same library calls the GUI makes, driven from a terminal.

/// `println!` that returns the write error instead of panicking, so `attnlab trf | head` ends
/// quietly when the reader goes away (main treats a broken pipe as success).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// `print!` with the same error handling as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*)?
    }};
}

mod analyse;
mod bench;
mod catalogue;
mod curves;
mod data;
mod eval;
mod extrapolate;
mod pretrained;
mod recall;
mod signals;
mod sweep;
mod train;

use std::path::PathBuf;

use crate::report::Format;
use clap::{Parser, Subcommand};

/// attnlab: train small models with a chosen attention mechanism and positional encoding,
/// and see what they learned.
#[derive(Debug, Parser)]
#[command(name = "attnlab", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Open the desktop workbench (also what `attnlab` with no command does).
    Gui,
    /// Train a preset; writes a run folder and shows live progress.
    Train {
        /// A preset file (TOML), or a shipped preset's name, e.g. mqar_softmax (found from
        /// any folder; `attnlab check NAME` prints it).
        #[arg(required_unless_present = "resume")]
        preset: Option<PathBuf>,
        /// Continue the stopped or crashed run in this run folder from its last checkpoint,
        /// exactly as it would have gone on (instead of training a preset).
        #[arg(long, value_name = "RUN", conflicts_with_all = ["preset", "overrides", "out"])]
        resume: Option<PathBuf>,
        /// Override one preset key, e.g. --set train.lr=3e-3 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Folder under which the run folder is created.
        #[arg(long, default_value = "runs")]
        out: PathBuf,
        /// No progress bar; print one line per evaluation (the run folder, the text read and
        /// warnings still go to stderr).
        #[arg(long)]
        quiet: bool,
    },
    /// Check a preset before training it: every key and range, the mechanism, encoding and
    /// task together, its memory estimate against this machine's, and its inputs here (a
    /// language model's corpus, a data folder); prints it fully resolved (every default
    /// filled in) with the estimate and the recurrent state.
    Check {
        /// A preset file (TOML), or a shipped preset's name, e.g. mqar_softmax.
        preset: PathBuf,
        /// Override one preset key, e.g. --set train.lr=3e-3 (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
    },
    /// Print the rows a preset's task trains and tests on, any task (`data PRESET`), or turn
    /// a folder of mad-lab's published data into a preset (`data import-mad DIR`).
    Data(data::DataArgs),
    /// Measure training speed on the reference MQAR configuration.
    Bench(bench::BenchArgs),
    /// Evaluate a run's checkpoint on its test set, optionally with keys changed, e.g.
    /// --set encoding.kind=rerope --set encoding.window=8 on a RoPE-trained run.
    Eval {
        run: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// The same as `--format json` (kept for scripts written before `--format`).
        #[arg(long, hide = true, conflicts_with = "format")]
        json: bool,
    },
    /// List the devices this build supports and whether each opens here (driver, GPU, kernels).
    Devices,
    /// List every positional encoding: family, formula, settings and their ranges.
    Encodings {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// List every attention mechanism: causality, formula, settings and their ranges.
    Mechanisms {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// List every task: what it asks, its paper, whether it needs a causal mixer, its defaults.
    Tasks {
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Loss, test accuracy and learning rate against the step of one or more run folders
    /// (the Training view's curves): a line per run, the points, or figures.
    Curves(curves::CurvesArgs),
    /// Bias and exp(bias) by distance, the exp(bias) heatmap, and whether Σ exp(bias) converges.
    Bias(analyse::BiasArgs),
    /// Theoretical receptive field (the paper's draw()), n_the(ε) and convergence verdicts.
    Trf(analyse::TrfArgs),
    /// Empirical receptive field of a trained run, with its TRF on the same axes.
    Erf(analyse::ErfArgs),
    /// IoU of each attention head against the MQAR ground truth (ReBased paper, Table 5).
    Iou(recall::IouArgs),
    /// Singular-value spectra of a run's attention matrices (Linformer, Figure 1).
    Spectrum(recall::SpectrumArgs),
    /// Train a grid of runs from a sweep file (resumable), plan it, or collect its results.
    Sweep(sweep::SweepArgs),
    /// Validation perplexity against length for LM runs or presets (trained first), with
    /// Definition 0.1's check and Theorem 0.4's verdict.
    Extrapolate(extrapolate::ExtrapolateArgs),
    /// Induction, previous-token, first-token and entropy scores of every head of a
    /// pretrained model in a Hugging Face folder (GPT-2, Pythia, GPT-Neo), on repeated random tokens.
    Heads(pretrained::HeadsArgs),
    /// A pretrained model's attention on a text (tokenised by the folder's tokenizer.json):
    /// every layer and head, with each head's previous-token, first-token, entropy and
    /// look-back scores on it.
    Attend(pretrained::AttendArgs),
}

/// A `usize` option accepting `lo..=hi`. An unbounded count reached an allocation: a huge
/// one panicked with "capacity overflow", a large one aborted asking for terabytes; clap now
/// refuses it with the range.
fn bounded(lo: u64, hi: u64) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(lo..=hi)
}

/// The model's recurrent state in words, for `attnlab check`.
fn state_line(preset: &crate::Preset) -> String {
    match preset.state() {
        Some(state) => format!(
            "recurrent state: {} floats at length {} (zoology units: {})",
            state.floats,
            preset.task.seq_len(),
            state.zoology_units
        ),
        None => format!("recurrent state: n/a ({})", preset.why_no_state()),
    }
}

/// Whether `error` is a write to a closed pipe (the reader of our output went away), which
/// ends a command quietly rather than as a failure.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `attnlab devices`: one line per device; fails when a GPU this build supports does not open,
/// so scripts on a GPU machine can check for it first.
fn devices() -> anyhow::Result<()> {
    let statuses = crate::device::probe_all();
    for status in &statuses {
        match &status.usable {
            Ok(()) => outln!("{:<8} ok", status.name),
            Err(why) => outln!("{:<8} unavailable: {why}", status.name),
        }
    }
    let failed = statuses.iter().filter(|s| s.usable.is_err()).count();
    anyhow::ensure!(failed == 0, "{failed} device(s) do not open here");
    Ok(())
}

/// Opens the desktop workbench.
#[cfg(feature = "gui")]
fn gui() -> anyhow::Result<()> {
    crate::app::run_native()
}

/// This build has no workbench: says how to get one, and where the headless commands are.
#[cfg(not(feature = "gui"))]
fn gui() -> anyhow::Result<()> {
    anyhow::bail!(
        "this attnlab was built without the desktop workbench (the `gui` feature); \
         rebuild with default features to open it, or run `attnlab --help` for the headless commands"
    )
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        None | Some(Command::Gui) => gui(),
        Some(Command::Train {
            resume: Some(run_dir),
            quiet,
            ..
        }) => train::resume(&run_dir, quiet),
        Some(Command::Train {
            preset: Some(preset),
            overrides,
            out,
            quiet,
            ..
        }) => train::train(&preset, &overrides, &out, quiet),
        Some(Command::Train { .. }) => anyhow::bail!("train needs a PRESET or --resume RUN"),
        Some(Command::Check { preset, overrides }) => {
            let preset = crate::experiments::load_preset(&preset, &overrides)?;
            outln!("{}", preset.to_toml()?.trim_end());
            let available = crate::memory::available_bytes()
                .map_or("unknown".into(), |b| crate::preset::bytes(b as f64));
            // A TOML comment, so the output stays a preset.
            outln!(
                "# memory: {}; available here: {available}",
                preset.memory_estimate()
            );
            outln!("# {}", state_line(&preset));
            preset.check_fits_here()?;
            preset.task.check_inputs_here()?;
            Ok(())
        }
        Some(Command::Data(args)) => data::data(&args),
        Some(Command::Bench(args)) => bench::bench(&args),
        Some(Command::Eval {
            run,
            overrides,
            format,
            json,
        }) => {
            let format = match json {
                true => Format::Json,
                false => format,
            };
            eval::eval(&run, &overrides, format)
        }
        Some(Command::Devices) => devices(),
        Some(Command::Encodings { format }) => catalogue::encodings(format),
        Some(Command::Mechanisms { format }) => catalogue::mechanisms(format),
        Some(Command::Tasks { format }) => catalogue::tasks(format),
        Some(Command::Curves(args)) => curves::curves(&args),
        Some(Command::Bias(args)) => analyse::bias(&args),
        Some(Command::Trf(args)) => analyse::trf(&args),
        Some(Command::Erf(args)) => analyse::erf(&args),
        Some(Command::Iou(args)) => recall::iou(&args),
        Some(Command::Spectrum(args)) => recall::spectrum(&args),
        Some(Command::Sweep(args)) => sweep::sweep(&args),
        Some(Command::Extrapolate(args)) => extrapolate::extrapolate(&args),
        Some(Command::Heads(args)) => pretrained::heads(&args),
        Some(Command::Attend(args)) => pretrained::attend(&args),
    }
}
